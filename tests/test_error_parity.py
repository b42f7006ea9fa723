"""Where CPU refuses a call, tpu refuses it too, with the same Python exception type and message,
raised at the call in every eager mode (not at a later flush under DeferAndFuse).

Each case runs on CPU first: a case CPU accepts fails the test (it would check nothing). The
messages are compared after one normalization: an AT_DISPATCH miss names the device's kernel
("\"lt_cpu\" not implemented for 'ComplexFloat'" against "\"lt_tpu\" ..."), so the quoted
kernel name is masked, and " on CPU" reads " on tpu".
"""
from __future__ import annotations

import re

import pytest
import torch

from conftest import raised_by


def _t(d, data, **kw):
    return torch.tensor(data, device=d, **kw)


def _c(d):
    return _t(d, [1 + 1j, 2 - 1j])


def _e(d, *shape):
    return torch.empty(*shape, device=d)


def _out(d, dtype, n=2):
    return torch.empty(n, dtype=dtype, device=d)


CASES = {
    # out= of a dtype the result type cannot be cast to (one check for every out= overload)
    "add_out_long": lambda d: torch.add(_t(d, [1.0, 2.0]), _t(d, [1.0, 2.0]), out=_out(d, torch.long)),
    "mul_scalar_out_int": lambda d: torch.mul(_t(d, [1.0, 2.0]), 2, out=_out(d, torch.int)),
    "sin_out_long": lambda d: torch.sin(_t(d, [1.0, 2.0]), out=_out(d, torch.long)),
    "mean_out_long": lambda d: torch.mean(_t(d, [1.0, 2.0]), 0, out=_out(d, torch.long, 0)),
    "add_out_complex_to_double": lambda d: torch.add(_c(d), 1, out=_out(d, torch.double)),
    "pow_out_float_to_int": lambda d: torch.pow(_t(d, [1.0, 2.0]), 2, out=_out(d, torch.int)),
    "max_dim_out_values_int": lambda d: torch.max(
        _t(d, [[1.0, 2.0]]), 1, out=(_out(d, torch.int, 1), _out(d, torch.long, 1))),
    # integers to negative integer powers
    "pow_int_neg": lambda d: torch.pow(_t(d, [1, 2]), -2),
    "pow_uint8_neg": lambda d: _t(d, [1, 2], dtype=torch.uint8) ** -1,
    "pow_bool_neg": lambda d: torch.pow(_t(d, [True]), -1),
    "pow_int_neg_out": lambda d: torch.pow(_t(d, [1, 2]), -1, out=_out(d, torch.long)),
    # bool subtraction and negation
    "sub_bool_bool": lambda d: _t(d, [True]) - _t(d, [False]),
    "sub_bool_pybool": lambda d: _t(d, [True]) - True,
    "sub_bool_int": lambda d: _t(d, [True]) - 1,
    "rsub_bool_pybool": lambda d: torch.rsub(_t(d, [True]), True),
    "sub_bool_out": lambda d: torch.sub(_t(d, [True]), _t(d, [False]), out=_out(d, torch.bool, 1)),
    "neg_bool": lambda d: -_t(d, [True]),
    # complex ordering
    "maximum_complex": lambda d: torch.maximum(_c(d), _c(d)),
    "minimum_complex_out": lambda d: torch.minimum(_c(d), _c(d), out=_out(d, torch.cfloat)),
    "max_other_complex": lambda d: torch.max(_c(d), _c(d)),
    "maximum_real_complex": lambda d: torch.maximum(_t(d, [1.0, 2.0]), _c(d)),
    "fmax_complex": lambda d: torch.fmax(_c(d), _c(d)),
    "fmin_complex": lambda d: torch.fmin(_c(d), _c(d)),
    "clamp_complex": lambda d: torch.clamp(_c(d), 0, 1),
    "clamp_min_only_complex": lambda d: torch.clamp(_c(d), min=0),
    "clamp_tensor_complex": lambda d: torch.clamp(_c(d), _c(d), _c(d)),
    "clamp_min_complex": lambda d: torch.clamp_min(_c(d), 0),
    "clamp_min_tensor_complex": lambda d: torch.clamp_min(_c(d), _c(d)),
    "clip_complex": lambda d: torch.clip(_c(d), 0, 1),
    "clamp_no_bounds_complex": lambda d: torch.clamp(_c(d)),
    "max_complex": lambda d: torch.max(_c(d)),
    "max_dim_complex": lambda d: torch.max(_c(d), 0),
    "argmax_complex": lambda d: torch.argmax(_c(d)),
    "amin_complex": lambda d: torch.amin(_c(d)),
    "aminmax_complex": lambda d: torch.aminmax(_c(d)),
    "cummax_complex": lambda d: torch.cummax(_c(d), 0),
    "lt_complex": lambda d: _c(d) < _c(d),
    "ge_real_complex_scalar": lambda d: torch.ge(_t(d, [1.0]), 1j),
    "sort_complex": lambda d: torch.sort(_c(d)),
    "argsort_complex": lambda d: torch.argsort(_c(d)),
    "topk_complex": lambda d: torch.topk(_c(d), 1),
    "median_complex": lambda d: torch.median(_c(d)),
    "mode_complex": lambda d: torch.mode(_c(d)),
    "searchsorted_complex": lambda d: torch.searchsorted(_c(d), _c(d)),
    "floor_complex": lambda d: torch.floor(_c(d)),
    "trunc_complex": lambda d: torch.trunc(_c(d)),
    "sign_complex": lambda d: torch.sign(_c(d)),
    "signbit_complex": lambda d: torch.signbit(_c(d)),
    "remainder_complex": lambda d: torch.remainder(_c(d), _c(d)),
    "fmod_complex": lambda d: torch.fmod(_c(d), 2),
    "floor_divide_complex": lambda d: torch.floor_divide(_c(d), _c(d)),
    "div_floor_complex": lambda d: torch.div(_c(d), _c(d), rounding_mode="floor"),
    "div_trunc_complex": lambda d: torch.div(_c(d), 2, rounding_mode="trunc"),
    "atan2_complex": lambda d: torch.atan2(_c(d), _c(d)),
    "hypot_complex": lambda d: torch.hypot(_c(d), _c(d)),
    "xlogy_complex": lambda d: torch.xlogy(_c(d), _c(d)),
    "round_complex": lambda d: torch.round(_c(d)),
    "erf_complex": lambda d: torch.erf(_c(d)),
    "logit_complex": lambda d: torch.logit(_c(d)),
    # reductions that select an element, over an empty dim
    "median_empty_dim": lambda d: torch.median(_e(d, 0, 3), 0),
    "median_empty_dim_negative": lambda d: torch.median(_e(d, 0, 3), -2),
    "median_empty_dim_out": lambda d: torch.median(
        _e(d, 0, 3), 0, out=(_e(d, 0), torch.empty(0, dtype=torch.long, device=d))),
    "nanmedian_empty_dim": lambda d: torch.nanmedian(_e(d, 3, 0), 1, keepdim=True),
    "mode_empty_dim": lambda d: torch.mode(_e(d, 0, 3), 0),
    "kthvalue_empty_dim": lambda d: torch.kthvalue(_e(d, 0, 3), 1, 0),
    "max_empty_dim": lambda d: torch.max(_e(d, 0, 3), 0),
    "min_empty_all": lambda d: torch.min(_e(d, 0, 3)),
    # unique over a dim, indexing with two masks
    "unique_dim_zero_size_other_dim": lambda d: torch.unique(_e(d, 0, 3), dim=1),
    "unique_dim_out_of_range": lambda d: torch.unique(_t(d, [[1, 2]]), dim=2),
    "two_masks_mismatch": lambda d: torch.arange(12, device=d).view(3, 4)[
        _t(d, [True, False, True]), _t(d, [True, False, True, True])],
}


def _normalized(message: str) -> str:
    message = message.strip()
    message = re.sub(r'^"\w+" not implemented for', '"<kernel>" not implemented for', message)
    return message.replace(" on CPU", " on tpu")


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_error_as_cpu(case, mode):
    fn = CASES[case]
    expected = raised_by(fn, "cpu")
    assert expected is not None, f"{case}: CPU accepts it, so it checks nothing"
    got = raised_by(fn, "tpu")  # raised by the call itself: nothing is read back here
    assert got is not None, f"{case}: CPU raises {type(expected).__name__}: {expected}; tpu runs it"
    assert type(got) is type(expected), (type(got), got, type(expected), expected)
    assert _normalized(str(got)) == _normalized(str(expected))


# Calls on the edge of the refusals above, which CPU accepts: tpu gives the same values.
ACCEPTED = {
    "add_out_float_from_int": lambda d: torch.add(_t(d, [1, 2]), _t(d, [3, 4]), out=_out(d, torch.float)),
    "sum_out_long_from_float": lambda d: torch.sum(_t(d, [1.5, 2.0]), 0, out=_out(d, torch.long, 0)),
    "pow_int_tensor_neg_exponent": lambda d: torch.pow(_t(d, [1, 2]), _t(d, [-1, 2])),
    "pow_int_neg_float": lambda d: torch.pow(_t(d, [1, 2]), -2.0),
    "pow_scalar_base_neg_tensor": lambda d: torch.pow(2, _t(d, [-1, 2])),
    "clamp_real_complex_free": lambda d: torch.clamp(_t(d, [1.0, 5.0]), 0, 2),
    "eq_complex": lambda d: _c(d) == _c(d),
    "div_complex": lambda d: torch.div(_c(d), _c(d), rounding_mode=None),
    "median_empty_other_dim": lambda d: torch.median(_e(d, 0, 3), 1).values,
    "median_empty_all": lambda d: torch.median(_e(d, 0)),
    "median_0d_dim0": lambda d: torch.median(_t(d, 1.0), 0).values,
    "unique_dim0": lambda d: torch.unique(_t(d, [[3, 4], [1, 2], [3, 4]]), dim=0,
                                          return_inverse=True, return_counts=True),
    "unique_dim1": lambda d: torch.unique(_t(d, [[3, 4, 3], [1, 2, 1]]), dim=1,
                                          return_inverse=True, return_counts=True),
    "unique_dim_empty_selected": lambda d: torch.unique(_e(d, 0, 3), dim=0),
    "two_masks": lambda d: torch.arange(12, device=d).view(3, 4)[
        _t(d, [True, False, True]), _t(d, [True, False, False, True])],
    "two_masks_around_slice": lambda d: torch.arange(24, device=d).view(2, 3, 4)[
        _t(d, [True, False]), :, _t(d, [True, False, False, True])],
}


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_accepted_like_cpu(case):
    fn = ACCEPTED[case]
    expected, got = fn("cpu"), fn("tpu")
    if isinstance(expected, torch.Tensor):
        expected, got = (expected,), (got,)
    for e, g in zip(expected, got, strict=True):
        assert g.device.type == "tpu"
        torch.testing.assert_close(g.cpu(), e, equal_nan=True)
