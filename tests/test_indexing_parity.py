"""Advanced indexing on tpu against CPU: values, dtypes and shapes of what CPU accepts, the type
and message of what it refuses, and the warnings it gives (uint8 masks are deprecated: CPU
warns once per uint8 index tensor per call).

Covered: uint8 masks (alone, several at once, beside integer indices; index and index_put),
index_put's order of checks (values' shape before their dtype), a mask write whose values have
the wrong number of rows (was written silently), CPU's masked_fill_ path of index_put (a
one-element CPU value through a lone mask), and index_put from TorchScript (a generic list).
Each case runs in every eager mode (the ``mode`` fixture).
"""
from __future__ import annotations

import warnings

import pytest
import torch

U8 = torch.uint8


def _t(d, data, **kw):
    return torch.tensor(data, device=d, **kw)


def _run(fn, device):
    """(result or exception, the messages of the warnings the call gave)."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            out = fn(device)
        except Exception as e:  # noqa: BLE001 (the type is compared)
            out = e
        if isinstance(out, torch.Tensor):
            out = out.cpu()  # a deferred error would surface here, inside the case
    return out, [str(x.message).split(" (Triggered internally")[0] for x in w]


def _same(case, fn):
    expected, expected_warnings = _run(fn, "cpu")
    got, got_warnings = _run(fn, "tpu")
    if isinstance(expected, Exception):
        assert isinstance(got, Exception), f"{case}: CPU raises {expected!r}; tpu gives {got}"
        assert type(got) is type(expected), (got, expected)
        assert str(got) == str(expected)
    else:
        assert not isinstance(got, Exception), f"{case}: CPU accepts; tpu raises {got!r}"
        assert got.dtype == expected.dtype and got.shape == expected.shape
        torch.testing.assert_close(got, expected, equal_nan=True)
    assert got_warnings == expected_warnings, case


def _x(d, *shape, dtype=torch.float32):
    n = 1
    for s in shape:
        n *= s
    return torch.arange(n, device=d).to(dtype).view(*shape)


def _put(x, idx, v, accumulate=False):
    x.index_put_(idx, v, accumulate=accumulate)
    return x


def _set(x, idx, v):
    x[idx] = v
    return x


CASES = {
    # uint8 masks: same values as bool ones, one deprecation warning per uint8 index tensor
    "u8_read": lambda d: _x(d, 5, 3)[_t(d, [1, 0, 1, 1, 0], dtype=U8)],
    "u8_read_0d": lambda d: _x(d, 2)[_t(d, 1, dtype=U8)],
    "u8_read_after_slice": lambda d: _x(d, 2, 4)[:, _t(d, [0, 2, 0, 1], dtype=U8)],
    "u8_two_masks": lambda d: _x(d, 5, 7, 3)[_t(d, [1, 0, 1, 1, 0], dtype=U8), :,
                                             _t(d, [1, 1, 1], dtype=U8)],
    "u8_mask_and_long": lambda d: _x(d, 3, 4)[_t(d, [1, 0, 1], dtype=U8), _t(d, [0, 3])],
    "bool_and_u8": lambda d: _x(d, 3, 4)[_t(d, [True, False, True]),
                                         _t(d, [0, 1, 0, 1], dtype=U8)],
    "u8_put": lambda d: _set(_x(d, 4, 4), _t(d, [1, 0, 1, 0], dtype=U8),
                             _t(d, [3.0, 4.0, 5.0, 6.0])),
    "u8_put_accumulate_empty": lambda d: _put(torch.ones(10, 10, device=d),
                                              (torch.zeros(10, dtype=U8, device=d),),
                                              torch.ones(0, 10, device=d), accumulate=True),
    "u8_put_accumulate_rows": lambda d: _put(_x(d, 4, 2), (_t(d, [0, 1, 1, 0], dtype=U8),),
                                             _t(d, [[1.0, 2.0], [3.0, 4.0]]), accumulate=True),
    "u8_two_masks_put": lambda d: _put(_x(d, 3, 4), (_t(d, [1, 0, 1], dtype=U8),
                                                     _t(d, [0, 1, 0, 1], dtype=U8)),
                                       _t(d, [10.0, 20.0])),
    "u8_mask_and_long_put": lambda d: _put(_x(d, 3, 4), (_t(d, [1, 0, 1], dtype=U8),
                                                         _t(d, [2])), _t(d, [7.0])),
    "u8_mask_shape_mismatch": lambda d: _x(d, 3, 4)[_t(d, [1, 0], dtype=U8)],
    # no warning where the index dtype is refused first
    "u8_beside_float_index": lambda d: _x(d, 3, 4)[_t(d, [1, 0, 1], dtype=U8), _t(d, [0.0])],
    # index_put: values' shape is checked before their dtype
    "put_shape_before_dtype_empty": lambda d: _set(torch.arange(4, device=d),
                                                   torch.arange(4, device=d) > -1,
                                                   _t(d, [])),
    "put_shape_before_dtype_long_index": lambda d: _set(torch.arange(4, device=d),
                                                        _t(d, [0, 1]), _t(d, [1.0, 2.0, 3.0])),
    "put_dtype_mismatch": lambda d: _set(torch.arange(4, device=d), _t(d, [0, 1]),
                                         _t(d, [1.0, 2.0])),
    "put_dtype_mismatch_accumulate": lambda d: _put(torch.arange(4, device=d),
                                                    (_t(d, [True, False, True, True]),),
                                                    _t(d, 1.5), accumulate=True),
    "put_index_check_before_dtype": lambda d: _set(torch.arange(4, device=d),
                                                   (_t(d, [0, 1]), _t(d, [0, 1, 2])),
                                                   _t(d, [1.0])),
    # a mask write needs exactly count rows (or one, broadcast)
    "mask_rows_too_many": lambda d: _set(torch.arange(4, device=d),
                                         torch.arange(4, device=d) > -1, _t(d, [1, 2, 3])),
    "mask_rows_view": lambda d: _set(torch.arange(4, device=d)[:1],
                                     torch.arange(4, device=d)[:1] > -1, _t(d, [1, 2, 3])),
    "mask_rows_too_few": lambda d: _set(_x(d, 4, 2), _t(d, [True, True, False, True]),
                                        torch.ones(2, 2, device=d)),
    "mask_rows_none_true": lambda d: _set(_x(d, 3), _t(d, [False, False, False]),
                                          torch.ones(2, device=d)),
    "mask_rows_exact": lambda d: _set(_x(d, 4, 2), _t(d, [True, False, False, True]),
                                      _t(d, [[1.0, 2.0], [3.0, 4.0]])),
    "mask_rows_broadcast": lambda d: _set(_x(d, 4, 2), _t(d, [True, False, False, True]),
                                          _t(d, [[1.0, 2.0]])),
    "mask_inner_dim_mismatch": lambda d: _set(_x(d, 4, 2), _t(d, [True, False, False, True]),
                                              torch.ones(1, 3, device=d)),
    "mask_after_slice_rows": lambda d: _set(_x(d, 2, 3), (slice(None), _t(d, [True, False, True])),
                                            _t(d, [[1.0, 2.0], [3.0, 4.0]])),
    "mask_after_slice_rows_wrong": lambda d: _set(_x(d, 2, 3),
                                                  (slice(None), _t(d, [True, False, True])),
                                                  _t(d, [1.0, 2.0, 3.0])),
    "mask_rows_accumulate": lambda d: _put(_x(d, 4), (_t(d, [True, False, True, True]),),
                                           _t(d, [1.0, 2.0, 3.0]), accumulate=True),
    "long_index_values_mismatch": lambda d: _set(_x(d, 5, 5), (_t(d, [[0], [1], [2]]),
                                                               _t(d, [0, 1, 2])),
                                                 _t(d, [2.0, 3.0, 4.0, 5.0])),
    "long_index_nonadjacent_values": lambda d: _set(_x(d, 2, 3, 4), (_t(d, [0, 1]), slice(None),
                                                                     _t(d, [1, 2])),
                                                    torch.ones(2, 3, device=d)),
    "long_index_nonadjacent_mismatch": lambda d: _set(_x(d, 2, 3, 4), (_t(d, [0, 1]),
                                                                       slice(None), _t(d, [1, 2])),
                                                      torch.ones(3, 2, device=d)),
    # CPU's masked_fill_ path: a one-element CPU value through a lone mask
    "cpu_value_other_dtype": lambda d: _set(torch.arange(4, device=d),
                                            torch.arange(4, device=d) > 1, torch.tensor(1.5)),
    "cpu_value_one_elem_1d": lambda d: _set(_x(d, 2, 3), _t(d, [True, False]), torch.tensor([7.0])),
    "cpu_value_mask_after_slice": lambda d: _set(_x(d, 2, 3, 2),
                                                 (slice(None), _t(d, [True, False, True])),
                                                 torch.tensor(-1.0)),
    "cpu_value_out_of_place": lambda d: torch.index_put(_x(d, 4), (_x(d, 4) > 1,),
                                                        torch.tensor(9, dtype=torch.int64)),
    "cpu_value_u8_mask": lambda d: _set(_x(d, 4), _t(d, [1, 0, 1, 0], dtype=U8), torch.tensor(7.0)),
    "cpu_value_mask_shape": lambda d: _set(_x(d, 4), _t(d, [True, False]), torch.tensor(7.0)),
    "masked_fill_u8_mask": lambda d: _x(d, 4).masked_fill_(_t(d, [1, 0, 1, 0], dtype=U8), 1.0),
    "masked_fill_out_of_place_u8_mask": lambda d: _x(d, 4).masked_fill(
        _t(d, [1, 0, 1, 0], dtype=U8), torch.tensor(2.0)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_as_cpu(case, mode):
    _same(case, CASES[case])


def test_uint8_warning_once_per_call():
    # the deprecation warning is given by each call, not only by the first one
    x = torch.zeros(3, device="tpu")
    m = _t("tpu", [1, 0, 1], dtype=U8)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(3):
            x[m]
    assert len(w) == 3


def test_scripted_index_put():
    def fn(x):
        x[x < 5] = 1.0
        return x

    scripted = torch.jit.script(fn)
    expected = scripted(torch.arange(10, dtype=torch.float))
    got = scripted(torch.arange(10, dtype=torch.float, device="tpu"))
    torch.testing.assert_close(got.cpu(), expected)
