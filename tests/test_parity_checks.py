"""CPU's argument checks and deterministic-mode fills, on tpu: the same Python exception type and
message where CPU refuses a call, the same values where it accepts one.

Covered: index_fill_'s refusal of a complex value for a self that is not complex (before the
value's overflow check, on the general and the view path, Scalar and 0-d Tensor values);
heaviside's refusal of complex tensors and of mixed dtypes, out= included (before any out= cast
check); and, with torch.use_deterministic_algorithms(True) and
torch.utils.deterministic.fill_uninitialized_memory, the fill of new memory by empty,
empty_strided, empty_like, empty_permuted, empty(out=) and resize_ (NaN for floating and
complex types, the largest value for integer types, true for bool).
"""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.utils.deterministic

from conftest import fallback_count, raised_by


def _same_error(fn):
    expected = raised_by(fn, "cpu")
    assert expected is not None, "CPU accepts it, so it checks nothing"
    got = raised_by(fn, "tpu")
    assert got is not None, f"CPU raises {type(expected).__name__}: {expected}; tpu runs it"
    assert type(got) is type(expected), (type(got), got, type(expected), expected)
    assert str(got) == str(expected)


# ---- index_fill_ -------------------------------------------------------------------------

def _m(d, dtype):
    return torch.tensor([[1, 2], [4, 5]], dtype=dtype, device=d)


def _i(d, *values):
    return torch.tensor(list(values) or [0], device=d)


INDEX_FILL_REFUSED = {
    "scalar_inplace": lambda d, t: _m(d, t).index_fill_(1, _i(d), 1 + 1j),
    "scalar_functional": lambda d, t: _m(d, t).index_fill(1, _i(d), 1 + 1j),
    "tensor_value": lambda d, t: _m(d, t).index_fill_(1, _i(d), torch.tensor(1 + 1j, device=d)),
    "cpu_tensor_value": lambda d, t: _m(d, t).index_fill_(1, _i(d), torch.tensor(2 + 0j)),
    # a partial view takes the view path (view_index_put.cpp), which makes the same checks
    "view": lambda d, t: _m(d, t)[:, :1].index_fill_(1, _i(d), 1 + 1j),
    # CPU refuses the complex value before it looks at the index's values
    "index_out_of_range": lambda d, t: _m(d, t).index_fill_(1, _i(d, 5), 1 + 1j),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16,
                                   torch.int64, torch.int8, torch.uint8, torch.bool])
@pytest.mark.parametrize("case", sorted(INDEX_FILL_REFUSED))
def test_index_fill_complex_value_refused_like_cpu(case, dtype, mode):
    _same_error(lambda d: INDEX_FILL_REFUSED[case](d, dtype))


def test_index_fill_overflow_still_refused_like_cpu():
    # a real value self's dtype cannot hold: the conversion's own message, on both paths
    _same_error(lambda d: _m(d, torch.float32).index_fill_(1, _i(d), 1e300))
    _same_error(lambda d: _m(d, torch.float32)[:, :1].index_fill_(1, _i(d), 1e300))
    _same_error(lambda d: _m(d, torch.complex64).index_fill_(1, _i(d), 1e300))


@pytest.mark.parametrize("make", [
    lambda d: _m(d, torch.complex64).index_fill_(1, _i(d), 1 + 1j),
    lambda d: _m(d, torch.complex128)[:, :1].index_fill_(1, _i(d), 2 - 3j),
    lambda d: _m(d, torch.float64).index_fill_(1, _i(d), 1e300),
    lambda d: _m(d, torch.bool).index_fill_(1, _i(d), True),
    lambda d: torch.tensor(1.0, device=d).index_fill_(0, _i(d), -1),
], ids=["complex", "complex_view", "double_large", "bool", "zero_dim"])
def test_index_fill_accepted_like_cpu(make):
    expected, got = make("cpu"), make("tpu")
    assert got.device.type == "tpu" and got.dim() == expected.dim()
    torch.testing.assert_close(got.cpu(), expected)


def _expanded(d, *shape):
    """A tensor of `shape` whose size-1 dims of a small distinct-valued base are expanded."""
    base_shape = [1 if i % 2 else n for i, n in enumerate(shape)]
    n = 1
    for s in base_shape:
        n *= s
    return (torch.arange(n, dtype=torch.float32) * 1.5 - 2).reshape(base_shape).to(d).expand(shape)


EXPANDED_FILLS = {
    # every indexed position writes through its one memory location, so any index fills it
    "1d_some": lambda d: _expanded(d, 1, 6)[0].index_fill_(0, _i(d, 4), 2.0),
    "1d_empty_index": lambda d: _expanded(d, 1, 6)[0].index_fill_(
        0, torch.tensor([], dtype=torch.long, device=d), 2.0),
    "along_expanded_dim": lambda d: _expanded(d, 3, 4).index_fill_(1, _i(d, 3, 0), -7.0),
    "across_expanded_dim": lambda d: _expanded(d, 3, 4).index_fill_(0, _i(d, 1), -7.0),
    "0d_index_tensor_value": lambda d: _expanded(d, 3, 4).index_fill_(
        -1, torch.tensor(2, device=d), torch.tensor(5.0, device=d)),
    "3d": lambda d: _expanded(d, 2, 5, 3).index_fill_(2, _i(d, 0, 2), -1.0),
}


@pytest.mark.parametrize("case", sorted(EXPANDED_FILLS))
def test_index_fill_of_expanded_tensor_warns_and_fills_like_cpu(case, mode):
    results = {}
    for d in ("cpu", "tpu"):
        with pytest.warns(UserWarning, match="index_fill_ on expanded tensors is deprecated"):
            out = EXPANDED_FILLS[case](d)
        results[d] = (out.cpu(), out.stride())
    assert torch.equal(results["tpu"][0], results["cpu"][0])
    assert results["tpu"][1] == results["cpu"][1]


@pytest.mark.parametrize("make", [
    # the control: an index of its own storage is accepted
    lambda d: torch.tensor([2, 1, 0], device=d).index_fill_(0, _i(d, 2, 1, 0), 0),
    # the index is self (a full overlap, which other in-place ops accept) or a part of it
    lambda d: (lambda t: t.index_fill_(0, t, 0))(torch.tensor([2, 1, 0], device=d)),
    lambda d: (lambda t: t[:3].index_fill_(0, t[2:], 0))(torch.tensor([2, 1, 0, 1], device=d)),
    # an expanded self still warns first, then the index's overlap is refused
    lambda d: (lambda t: t.expand(3).index_fill_(0, t, 0))(torch.tensor([0], device=d)),
    # dim out of range: PyTorch's IndexError (functional and 0-d self too)
    lambda d: torch.ones(3, 4, device=d).index_fill_(2, _i(d, 1), 2.0),
    lambda d: torch.ones(3, 4, device=d).index_fill(-3, _i(d, 1), 2.0),
    lambda d: torch.tensor(1.0, device=d).index_fill(1, torch.tensor(0, device=d), 2.0),
    lambda d: _expanded(d, 3, 4).index_fill_(2, _i(d, 1), 2.0),
], ids=["distinct_tensors_ok", "self_as_index", "partial", "expanded", "dim", "dim_functional",
        "dim_0d", "dim_expanded"])
def test_index_fill_overlap_and_dim_refused_like_cpu(make, mode):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the expanded-self deprecation warning
        expected = raised_by(make, "cpu")
        got = raised_by(make, "tpu")
    if expected is None:  # the accepted control case
        assert got is None
        return
    assert type(got) is type(expected) and str(got) == str(expected), (got, expected)


# ---- is_set_to: metadata only, as on CPU (no program, no fallback) --------------------------

def test_is_set_to_compares_metadata_like_cpu(mode):
    def pairs(d):
        a = torch.empty(2, 3, 4, device=d)
        b = torch.tensor([], device=d).set_(a)
        e = torch.empty(2, 0, device=d)
        bits = torch.tensor([True, False], device=d)
        return [
            (a, a), (a, b), (b, a),  # the same storage, offset, sizes and strides
            (a, torch.empty(2, 3, 4, device=d)),  # another storage
            (a, a.view(4, 3, 2)), (a, a.transpose(0, 1)), (a, a[1:]), (a, a.flatten()),
            (a[:, 1], b[:, 1]), (b.clone(), a), (a, b.clone().resize_(2, 3, 4)),
            (e, e.view(0)), (e, e),
            (torch.tensor([], device=d), torch.tensor([], device=d)),
            (bits, torch.tensor([False], device=d).set_(bits)),
        ]

    before = fallback_count()
    got = [x.is_set_to(y) for x, y in pairs("tpu")]
    assert fallback_count() == before, "is_set_to ran on the CPU"
    assert got == [x.is_set_to(y) for x, y in pairs("cpu")]


# ---- overlap checks: TensorIterator's before a kernel's dtype support; put_, index_put_ and
# masked_fill_ make their own (an index may not overlap self at all); writes through an
# expanded self warn and write each location as CPU's loop does ------------------------------

def _outcome(make, d):
    """(result or exception, warning messages) of make(d): what a parity check compares."""
    import warnings

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            out = make(d)
        except Exception as e:  # noqa: BLE001 (type and message are compared)
            out = e
    # the message without its C++ source location (PyTorch's file, or ours)
    return out, [str(x.message).split(" (Triggered internally at")[0] for x in w]


def _like_cpu(make):
    """tpu gives CPU's values, strides and dtype (or CPU's exception type and message) with
    CPU's warnings, in order."""
    (expected, cpu_warnings), (got, tpu_warnings) = _outcome(make, "cpu"), _outcome(make, "tpu")
    assert tpu_warnings == cpu_warnings
    if isinstance(expected, Exception):
        # a kernel named for its device ("lshift_cpu"): tpu names its own
        message = str(expected).replace('_cpu" not implemented', '_tpu" not implemented')
        assert type(got) is type(expected) and str(got) == message, (got, expected)
        return
    assert not isinstance(got, Exception), got
    assert got.device.type == "tpu" and got.dtype == expected.dtype
    assert got.stride() == expected.stride()
    assert torch.equal(got.cpu(), expected)


def _f(d, *values):
    return torch.tensor(list(values), dtype=torch.float32, device=d)


def _b(d, *bits):
    return torch.tensor([bool(b) for b in bits], device=d)


def _y(d):
    return torch.arange(6, dtype=torch.float32, device=d)


def _r(d):
    return torch.tensor([0.5, 1.5, 2.5, 3.5], device=d)


SHIFT_OVERLAP = {
    # TensorIterator's overlap check comes before the kernel's dtype support (a float shift)
    "ilshift_partial": lambda d: (lambda x: x[:-1].__ilshift__(x[1:]))(_r(d)),
    "irshift_partial": lambda d: (lambda x: x[:-1].__irshift__(x[1:]))(_r(d)),
    "bitwise_left_shift_partial": lambda d: (lambda x: x[1:].bitwise_left_shift_(x[:-1]))(_r(d)),
    "bitwise_and_partial": lambda d: (lambda x: x[1:].bitwise_and_(x[:-1]))(_r(d)),
    "ilshift_expanded": lambda d: _expanded(d, 1, 4)[0].__ilshift__(_r(d)),
    "out_partial": lambda d: (lambda x: torch.bitwise_right_shift(
        x[1:], x[:-1], out=x[:-1]))(_r(d)),
    # no overlap (or a full one): the dtype's refusal, as before
    "ilshift_full": lambda d: (lambda x: x.__ilshift__(x))(_r(d)),
    "ilshift_distinct": lambda d: _r(d).__ilshift__(_r(d)),
    "rshift_functional": lambda d: (lambda x: x[:-1] >> x[1:])(_r(d)),
    "ilshift_int_partial": lambda d: (lambda x: x[:-1].__ilshift__(x[1:]))(_i(d, 1, 2, 3)),
}


@pytest.mark.parametrize("case", sorted(SHIFT_OVERLAP))
def test_bitwise_overlap_refused_before_dtype_like_cpu(case, mode):
    _like_cpu(SHIFT_OVERLAP[case])


PUT_CHECKS = {
    # put_: self may not be expanded nor share memory with index or source at all
    "put_expanded": lambda d: _expanded(d, 1, 6)[0].put_(_i(d, 2, 1, 0), _f(d, 1, 2, 3)),
    "put_source_element_of_self": lambda d: (lambda y: y.put_(_i(d, 2), y[0]))(_y(d)),
    "put_source_part_of_self": lambda d: (lambda y: y.put_(_i(d, 2, 1, 0), y[:3]))(_y(d)),
    "put_self_as_index_and_source": lambda d: (lambda t: t.put_(t, t))(_i(d, 2, 1, 0)),
    "put_self_as_index": lambda d: (lambda t: t.put_(t, t.clone()))(_i(d, 2, 1, 0)),
    "put_self_as_source": lambda d: (lambda t: t.put_(t.clone(), t))(_i(d, 2, 1, 0)),
    "put_accumulate_self_as_source": lambda d: (lambda t: t.put_(t.clone(), t, accumulate=True))(
        _i(d, 2, 1, 0)),
    "put_distinct_ok": lambda d: _i(d, 2, 1, 0).put_(_i(d, 0, 2), _i(d, 7, 8)),
    "put_functional_self_ok": lambda d: (lambda t: t.put(t, t))(_i(d, 2, 1, 0)),
    # CPU's other checks come first (the overlap aside, the functional put makes them too;
    # the lowering converted another dtype silently and failed to compile on another count)
    "put_dtype_before_overlap": lambda d: (lambda t: t.put_(t, t.float()))(_i(d, 2, 1, 0)),
    "put_count_before_overlap": lambda d: (lambda t: t.put_(t, t[:2]))(_i(d, 2, 1, 0)),
    "put_int32_index": lambda d: _y(d).put_(_i(d, 1, 2).int(), _f(d, 1, 2)),
    "put_int32_index_functional": lambda d: _y(d).put(_i(d, 1, 2).int(), _f(d, 1, 2)),
    "put_source_dtype": lambda d: _y(d).put_(_i(d, 1, 2), _f(d, 1, 2).double()),
    "put_source_dtype_functional": lambda d: _y(d).put(_i(d, 1, 2), _f(d, 1, 2).double()),
    "put_count": lambda d: _y(d).put_(_i(d, 1, 2), _f(d, 1, 2, 3)),
    "put_into_empty": lambda d: _y(d)[:0].put_(_i(d, 1, 2), _f(d, 1, 2)),
    "put_empty_into_empty_ok": lambda d: _y(d)[:0].put_(_i(d, 1)[:0], _f(d)),
}


@pytest.mark.parametrize("case", sorted(PUT_CHECKS))
def test_put_checks_like_cpu(case, mode):
    _like_cpu(PUT_CHECKS[case])


INDEX_PUT_MASKED_FILL_OVERLAP = {
    # index_put_: values or an index may not share memory with self at all
    "index_put_self_as_index_and_values": lambda d: (lambda t: t.index_put_((t,), t))(
        _i(d, 2, 1, 0)),
    "index_put_self_as_index": lambda d: (lambda t: t.index_put_((t,), t.clone()))(
        _i(d, 2, 1, 0)),
    "index_put_self_as_values": lambda d: (lambda t: t.index_put_((t.clone(),), t))(
        _i(d, 2, 1, 0)),
    "index_put_values_element_of_self": lambda d: (lambda y: y.index_put_(
        (_i(d, 2, 1, 0),), y[0]))(_y(d)),
    "index_put_values_part_of_self": lambda d: (lambda y: y.index_put_(
        (_i(d, 2, 1, 0),), y[:3]))(_y(d)),
    "index_put_accumulate_self_as_index": lambda d: (lambda t: t.index_put_(
        (t,), t.clone(), accumulate=True))(_i(d, 2, 1, 0)),
    "index_put_expanded_self_as_index": lambda d: (lambda t: t.expand(3).index_put_(
        (t,), _i(d, 1, 1, 1)))(_i(d, 0)),
    "index_put_distinct_ok": lambda d: _i(d, 2, 1, 0).index_put_(
        (_i(d, 2, 1, 0),), _i(d, 5, 6, 7)),
    "index_put_functional_self_ok": lambda d: (lambda t: torch.index_put(t, (t,), t))(
        _i(d, 2, 1, 0)),
    # CPU checks the overlap before values' dtype
    "index_put_overlap_before_dtype": lambda d: (lambda y: y.index_put_(
        (_i(d, 1),), y.view(torch.int32)[2:3]))(_y(d)),
    # masked_fill_: only a partial overlap of the mask with self is refused
    "masked_fill_mask_partly_self": lambda d: (lambda m: m[1:].masked_fill_(m[:-1], False))(
        _b(d, 1, 0, 1, 1, 0, 0)),
    "masked_fill_mask_is_self_ok": lambda d: (lambda m: m.masked_fill_(m, False))(_b(d, 1, 0, 1)),
    "masked_fill_value_element_of_self_ok": lambda d: (lambda y: y.masked_fill_(
        _b(d, 1, 0, 1, 0, 0, 1), y[1]))(_y(d)),
    # an expanded self warns first
    "masked_fill_expanded_mask_partly_self": lambda d: (lambda m: m[:3].view(1, 3).expand(2, 3)
                                                        .masked_fill_(m[1:], True))(
        _b(d, 0, 1, 0, 1)),
}


@pytest.mark.parametrize("case", sorted(INDEX_PUT_MASKED_FILL_OVERLAP))
def test_index_put_masked_fill_overlap_like_cpu(case, mode):
    _like_cpu(INDEX_PUT_MASKED_FILL_OVERLAP[case])


WRITES_THROUGH_EXPANDED = {
    # several positions share one location: the last value written there stays (CPU's loop
    # runs in the indexing result's row-major order), accumulate adds them all
    "index_put_1d": lambda d: _expanded(d, 1, 6)[0].index_put_(
        (_i(d, 2, 1, 0),), _f(d, 7, 8, 9)),
    "index_put_1d_accumulate": lambda d: _expanded(d, 1, 6)[0].index_put_(
        (_i(d, 2, 1, 5),), _f(d, 7, 8, 9), accumulate=True),
    "index_put_two_indices": lambda d: _expanded(d, 3, 4).index_put_(
        (_i(d, 0, 2, 2, 1), _i(d, 1, 3, 1, 0)), _f(d, 1, 2, 3, 4)),
    "index_put_two_indices_accumulate": lambda d: _expanded(d, 3, 4).index_put_(
        (_i(d, 0, 2, 2), _i(d, 1, 3, 1)), _f(d, 1, 2, 3), accumulate=True),
    "index_put_broadcast_value": lambda d: _expanded(d, 3, 4).index_put_(
        (_i(d, 2, 0),), torch.tensor(-5.0, device=d)),
    "index_put_empty_index": lambda d: _expanded(d, 3, 4).index_put_(
        (torch.tensor([], dtype=torch.long, device=d),), _f(d)),
    "setitem_slice_then_index": lambda d: (lambda t: (t.__setitem__(
        (slice(None), _i(d, 3, 1)), _f(d, 6, 7)), t)[1])(_expanded(d, 3, 4)),
    "index_put_bool_mask": lambda d: _expanded(d, 3, 4).index_put_(
        (_b(d, 1, 0, 1, 1, 0, 0, 0, 0, 1, 0, 1, 0).view(3, 4),), _f(d, 1, 2, 3, 4, 5)),
    # a one-element CPU value through a tpu mask: CPU's masked_fill_ path (both warn)
    "index_put_masked_fill_path": lambda d: _expanded(d, 3, 4).index_put_(
        (_b(d, 0, 1, 1),), torch.tensor(4.0)),
    "index_put_int64_accumulate": lambda d: torch.tensor([[3], [5]], device=d).expand(2, 3)
    .index_put_((_i(d, 1, 1, 0), _i(d, 0, 2, 2)), torch.tensor([10, 20, 30], device=d),
                accumulate=True),
    # a location is filled when any position it stands for is masked
    "masked_fill_1d": lambda d: _expanded(d, 1, 6)[0].masked_fill_(
        _b(d, 1, 0, 1, 1, 0, 0), 0.0),
    "masked_fill_rows": lambda d: _expanded(d, 3, 4).masked_fill_(
        _b(d, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0).view(3, 4), -1.0),
    "masked_fill_broadcast_mask": lambda d: _expanded(d, 3, 4).masked_fill_(
        _b(d, 0, 1, 0, 0), 2.5),
    "masked_fill_no_true": lambda d: _expanded(d, 3, 4).masked_fill_(_b(d, 0, 0, 0, 0), 2.5),
    "masked_fill_tensor_value": lambda d: _expanded(d, 2, 5, 3).masked_fill_(
        _b(d, 1, 0, 0), torch.tensor(9.0, device=d)),
    "masked_fill_cpu_tensor_value": lambda d: _expanded(d, 2, 5, 3).masked_fill_(
        _b(d, 0, 0, 1), torch.tensor(-9.0)),
}


@pytest.mark.parametrize("case", sorted(WRITES_THROUGH_EXPANDED))
def test_write_through_expanded_tensor_warns_and_writes_like_cpu(case, mode):
    _like_cpu(WRITES_THROUGH_EXPANDED[case])


# ---- heaviside ---------------------------------------------------------------------------

def _h(d, dtype, values=(-1, 0, 2)):
    return torch.tensor(values, dtype=dtype, device=d)


def _heaviside_forms(a, b, out_dtype):
    return {
        "functional": lambda d: torch.heaviside(_h(d, a), _h(d, b, (5, 6, 7))),
        "method": lambda d: _h(d, a).heaviside(_h(d, b, (5, 6, 7))),
        "inplace": lambda d: _h(d, a).heaviside_(_h(d, b, (5, 6, 7))),
        "out": lambda d: torch.heaviside(_h(d, a), _h(d, b, (5, 6, 7)),
                                         out=torch.empty(3, dtype=out_dtype, device=d)),
    }


@pytest.mark.parametrize("form", ["functional", "method", "inplace", "out"])
@pytest.mark.parametrize("a,b,out_dtype", [
    (torch.float32, torch.float64, torch.float32),
    (torch.bool, torch.float32, torch.bool),     # the out= cast is refused too: CPU names dtypes
    (torch.int64, torch.int32, torch.int64),
    (torch.complex64, torch.float32, torch.complex64),
    (torch.float32, torch.complex64, torch.float32),
    (torch.complex64, torch.complex64, torch.complex64),
])
def test_heaviside_refused_like_cpu(a, b, out_dtype, form):
    _same_error(_heaviside_forms(a, b, out_dtype)[form])


@pytest.mark.parametrize("out_dtype", [torch.float64, torch.int64, torch.complex64])
def test_heaviside_out_dtype_must_match_like_cpu(out_dtype):
    # same input dtypes, an out= tensor of another dtype (even one the result casts to)
    _same_error(_heaviside_forms(torch.float32, torch.float32, out_dtype)["out"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize("form", ["functional", "inplace", "out"])
def test_heaviside_accepted_like_cpu(dtype, form):
    values = (True, False, True) if dtype is torch.bool else (-1, 0, 2)

    def run(d):
        x, v = _h(d, dtype, values), _h(d, dtype, (True, True, False) if dtype is torch.bool
                                         else (5, 6, 7))
        if form == "functional":
            return torch.heaviside(x, v)
        if form == "inplace":
            return x.heaviside_(v)
        return torch.heaviside(x, v, out=torch.empty(3, dtype=dtype, device=d))

    expected, got = run("cpu"), run("tpu")
    assert got.device.type == "tpu"
    torch.testing.assert_close(got.cpu(), expected)


# ---- deterministic fill of new memory ----------------------------------------------------

@contextlib.contextmanager
def _deterministic(fill=True):
    old = (torch.are_deterministic_algorithms_enabled(),
           torch.is_deterministic_algorithms_warn_only_enabled(),
           torch.utils.deterministic.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = fill
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(old[0], warn_only=old[1])
        torch.utils.deterministic.fill_uninitialized_memory = old[2]


FILL_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
               torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool]

NEW_TENSORS = {
    "empty": lambda d, t: torch.empty(10, 9, device=d, dtype=t),
    "empty_out": lambda d, t: torch.empty(10, 9, out=torch.zeros(1, device=d, dtype=t)),
    "empty_like": lambda d, t: torch.empty_like(torch.zeros(10, 9, device=d, dtype=t)),
    "empty_strided_overlapping": lambda d, t: torch.empty_strided((10, 9), (1, 5), device=d,
                                                                  dtype=t),
    "empty_strided_gaps": lambda d, t: torch.empty_strided((4, 3), (7, 2), device=d, dtype=t),
    "empty_permuted": lambda d, t: torch.empty_permuted((2, 3, 5), (1, 0, 2), device=d,
                                                        dtype=t),
    "new_empty": lambda d, t: torch.zeros(2, device=d, dtype=t).new_empty(3, 4),
}


def _filled_value(dtype):
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    return True if dtype is torch.bool else torch.iinfo(dtype).max


@pytest.mark.parametrize("dtype", FILL_DTYPES)
@pytest.mark.parametrize("case", sorted(NEW_TENSORS))
def test_deterministic_empty_filled_like_cpu(case, dtype):
    with _deterministic():
        expected, got = NEW_TENSORS[case]("cpu", dtype), NEW_TENSORS[case]("tpu", dtype)
    assert got.device.type == "tpu"
    assert got.shape == expected.shape and got.stride() == expected.stride()
    torch.testing.assert_close(got.cpu(), expected, equal_nan=True)
    want = _filled_value(dtype)
    if want != want:  # NaN
        assert got.isnan().all().item()
    else:
        assert got.eq(want).all().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool, torch.complex64])
@pytest.mark.parametrize("size,stride,new_size", [
    ((10,), (1,), (5,)),
    ((10,), (0,), (10,)),
    ((10,), (1,), (20,)),
    ((2, 3, 4), None, (3, 4, 5)),
    ((2, 3, 4), (1, 4, 12), (4, 3, 4)),
    ((2, 3, 4), (1, 0, 1), (2, 4, 5)),
])
def test_deterministic_resize_like_cpu(dtype, size, stride, new_size):
    # The storage's old elements keep their values, the elements it gains are filled. A strided
    # tensor's storage has gaps no element covers (uninitialized on both devices), so each
    # device's storage is compared with its own contents before the resize, as CPU's own
    # guarantee reads.
    def run(d):
        if stride is None:
            a = torch.zeros(size, dtype=dtype, device=d)
        else:
            a = torch.empty_strided(size, stride, dtype=dtype, device=d).fill_(0)
        before = a.untyped_storage().clone()
        with _deterministic():
            a.resize_(new_size)
        old = torch.empty(0, dtype=dtype).set_(before.cpu())
        new = torch.empty(0, dtype=dtype).set_(a.untyped_storage().cpu())
        return a, old, new

    (ce, c_old, c_new), (te, t_old, t_new) = run("cpu"), run("tpu")
    assert te.device.type == "tpu"
    assert te.shape == ce.shape and te.stride() == ce.stride()
    assert t_new.numel() == c_new.numel() and t_old.numel() == c_old.numel()
    n = t_old.numel()
    if t_new.numel() <= n:
        torch.testing.assert_close(t_new, t_old, equal_nan=True)
        return
    torch.testing.assert_close(t_new[:n], t_old, equal_nan=True)
    want = _filled_value(dtype)
    gained = t_new[n:]
    assert (gained.isnan().all() if want != want else gained.eq(want).all()).item()


def test_no_fill_without_the_flag():
    # fill_uninitialized_memory off: nothing is written (the allocator's memory is returned)
    with _deterministic(fill=False):
        t = torch.empty(4, device="tpu")
    assert t.device.type == "tpu" and t.shape == (4,)


def test_fill_and_zero_of_overlapping_tensor_like_cpu():
    # CPU's fill_ and zero_ write through overlapping strides without an overlap error
    def run(d):
        a = torch.empty_strided((10,), (0,), device=d).fill_(3)
        b = torch.empty_strided((2, 3, 4), (1, 0, 1), device=d).fill_(7)
        c = torch.empty_strided((2, 3, 4), (1, 0, 1), device=d).zero_()
        return a, b, c

    for e, g in zip(run("cpu"), run("tpu"), strict=True):
        torch.testing.assert_close(g.cpu(), e)


@pytest.mark.parametrize("make,size,fmt", [
    (lambda d: torch.empty_strided((10,), (0,), device=d), (10,), None),
    (lambda d: torch.empty_strided((2, 3, 4), (1, 4, 12), device=d), (2, 3, 4), None),
    (lambda d: torch.empty_strided((2, 3, 4), (1, 4, 12), device=d), (2, 3, 4),
     torch.contiguous_format),
    (lambda d: torch.empty(2, 3, 4, 5, device=d), (2, 3, 4, 5), torch.channels_last),
    (lambda d: torch.empty_strided((2, 3), (1, 2), device=d), (3, 2), None),
], ids=["stride0_same", "strided_same", "strided_same_contiguous", "channels_last", "other"])
def test_resize_strides_like_cpu(make, size, fmt):
    # a resize_ to the same sizes keeps the strides, as on CPU, unless a memory format is given
    def run(d):
        a = make(d)
        return a.resize_(size) if fmt is None else a.resize_(size, memory_format=fmt)

    e, g = run("cpu"), run("tpu")
    assert g.shape == e.shape and g.stride() == e.stride()


# ---- masked_scatter's mask dtype, gcd / lcm of floating operands -----------------------------

@pytest.mark.parametrize("inplace", [True, False])
def test_masked_scatter_uint8_mask_refused_like_cpu(inplace):
    def call(d):
        x = torch.zeros(4, device=d)
        mask = torch.tensor([1, 0, 1, 0], dtype=torch.uint8, device=d)
        src = torch.arange(4.0, device=d)
        return x.masked_scatter_(mask, src) if inplace else x.masked_scatter(mask, src)

    _same_error(call)


@pytest.mark.parametrize("op", [torch.gcd, torch.lcm])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.complex64])
def test_gcd_lcm_of_floating_refused_like_cpu(op, dtype):
    expected = raised_by(lambda d: op(torch.ones(2, dtype=dtype, device=d),
                                      torch.ones(2, dtype=dtype, device=d)), "cpu")
    got = raised_by(lambda d: op(torch.ones(2, dtype=dtype, device=d),
                                 torch.ones(2, dtype=dtype, device=d)), "tpu")
    assert isinstance(expected, NotImplementedError)
    assert type(got) is type(expected), got


@pytest.mark.parametrize("op", [torch.gcd, torch.lcm])
def test_gcd_lcm_of_integers_still_computed(op):
    a, b = torch.tensor([12, -18, 0, 7]), torch.tensor([8, 12, 5, 0])
    assert torch.equal(op(a.to("tpu"), b.to("tpu")).cpu(), op(a, b))


# ---- reflection / replication padding keep self's memory format, as CPU's kernels do ----------

@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("shape,fmt,pad", [
    ((2, 3, 5, 6), torch.channels_last, (1, 2, 3, 4)),
    ((2, 3, 5, 6, 5), torch.channels_last_3d, (1, 2, 3, 2, 1, 1)),
    ((2, 3, 5, 6), torch.contiguous_format, (1, 2, 3, 4)),
])
def test_pad_memory_format_like_cpu(mode, shape, fmt, pad):
    x = torch.randn(*shape).contiguous(memory_format=fmt)
    g = torch.randn(torch.nn.functional.pad(x, pad, mode=mode).shape)
    results = {}
    for d in ("cpu", "tpu"):
        xd = x.to(d).requires_grad_()
        y = torch.nn.functional.pad(xd, pad, mode=mode)
        (gx,) = torch.autograd.grad(y, xd, g.to(d))
        results[d] = (y, gx)
    for ours, cpus in zip(results["tpu"], results["cpu"]):
        assert ours.stride() == cpus.stride()
        torch.testing.assert_close(ours.cpu(), cpus)


# ---- arange / range: CPU's checks and words; range lowered; repeat_interleave's repeats dtype ----

@pytest.mark.parametrize("args", [
    (-5, float("nan")), (float("nan"), 10), (0, float("inf"), 1), (0, float("-inf"), -1),
    (float("-inf"), 10), (0, 3, 0), (5, 0), (0, 5, -1), (1.175494351e-38, 3.402823466e38),
])
def test_arange_refused_like_cpu(args):
    _same_error(lambda d: torch.arange(*args, device=d))


@pytest.mark.parametrize("args", [(0, -3), (0, float("nan")), (0, 3, 0)])
def test_range_refused_like_cpu(args):
    with pytest.warns(UserWarning, match="deprecated"):
        _same_error(lambda d: torch.range(*args, device=d))


@pytest.mark.parametrize("args,dtype", [((0, 10), None), ((1, 2, 0.3), None),
                                        ((1, 4), torch.int32), ((-3.5, 2.5, 0.5), torch.float64)])
def test_range_values_like_cpu(args, dtype):
    before = fallback_count()
    with pytest.warns(UserWarning, match="deprecated"):
        expected = torch.range(*args, dtype=dtype)
        got = torch.range(*args, dtype=dtype, device="tpu")
    assert fallback_count() == before, "range ran on the CPU"
    assert got.dtype == expected.dtype
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.int8])
def test_repeat_interleave_repeats_dtype_refused_like_cpu(dtype):
    expected = raised_by(lambda d: torch.repeat_interleave(torch.ones(3, dtype=dtype, device=d)),
                         "cpu")
    got = raised_by(lambda d: torch.repeat_interleave(torch.ones(3, dtype=dtype, device=d)), "tpu")
    assert isinstance(expected, NotImplementedError)
    assert type(got) is type(expected), got


# ---- hash_tensor (xor of 64-bit widened bits), lowered -------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64,
                                   torch.int8, torch.int32, torch.int64, torch.uint8, torch.bool])
@pytest.mark.parametrize("kw", [{}, {"dim": 1}, {"dim": [0], "keepdim": True}, {"dim": (0, 1)}])
def test_hash_tensor_like_cpu(dtype, kw):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 5, generator=g) * 100
    a = a > 0 if dtype is torch.bool else a.to(dtype)
    before = fallback_count()
    got = torch.hash_tensor(a.to("tpu"), **kw)
    assert fallback_count() == before
    expected = torch.hash_tensor(a, **kw)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got.cpu(), expected)


def test_hash_tensor_of_complex_refused_like_cpu():
    got = raised_by(lambda d: torch.hash_tensor(torch.ones(2, dtype=torch.complex64, device=d)),
                    "tpu")
    assert isinstance(got, NotImplementedError)


# ---- masked_scatter_ with a short source: CPU's error at the next synchronization ------------

def test_masked_scatter_short_source_raises_at_sync():
    mask = torch.tensor([0, 0, 0, 0, 1, 0, 1, 0, 1, 0], dtype=torch.bool)
    for n in (2, 0):
        dest = torch.arange(10.0, device="tpu")
        dest.masked_scatter_(mask.to("tpu"), torch.zeros(n, device="tpu"))
        with pytest.raises(RuntimeError, match="Number of elements of source < number of ones"):
            dest.cpu()
    dest = torch.arange(10.0, device="tpu")  # a long enough source still writes
    dest.masked_scatter_(mask.to("tpu"), torch.full((3,), -1.0, device="tpu"))
    expected = torch.arange(10.0).masked_scatter_(mask, torch.full((3,), -1.0))
    assert torch.equal(dest.cpu(), expected)


# ---- index_add_ / index_reduce_ with a source empty along dim (PyTorch's Meta kernel raised) ----

@pytest.mark.parametrize("dim", [0, 1, 2])
@pytest.mark.parametrize("op", ["index_add_", "amax", "prod", "mean"])
def test_index_ops_with_empty_source_like_cpu(dim, op):
    size = (3, 4, 5)
    src_size = size[:dim] + (0,) + size[dim + 1:]
    dest = torch.randn(size)
    results = []
    for d in ("cpu", "tpu"):
        x = dest.to(d)
        src = torch.randn(src_size).to(d)
        idx = torch.zeros(0, dtype=torch.long, device=d)
        if op == "index_add_":
            x.index_add_(dim, idx, src)
        else:
            x.index_reduce_(dim, idx, src, op, include_self=False)
        results.append(x.cpu())
    assert torch.equal(results[0], results[1])


# ---- legacy storage classes: storage_type() of a tpu tensor ---------------------------------

def test_storage_type_is_the_device_modules_class():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is deprecated
        for dtype in (torch.float32, torch.int64, torch.bool, torch.complex64):
            t = torch.zeros(3, dtype=dtype, device="tpu")
            cls = t.storage_type()
            assert cls is getattr(torch.tpu, cls.__name__)
            assert cls.dtype == dtype
            assert isinstance(t.storage(), cls)
            assert not isinstance(t.cpu().storage(), cls)
        s = torch.tpu.DoubleStorage([1.0, 2.0])
        assert s.device.type == "tpu" and s.tolist() == [1.0, 2.0]


# ---- storage slices: UntypedStorage[a:b] points into its storage ------------------------------

@pytest.mark.parametrize("dtype", [torch.int16, torch.float32, torch.complex128, torch.bool])
@pytest.mark.parametrize("start,stop", [(0, 4), (4, 12), (6, 16)])
def test_storage_slice_reads_and_writes_like_cpu(dtype, start, stop):
    # a slice's bytes, element by element (each a set_ of a byte tensor to the slice), and
    # writes through it landing in the sliced storage
    got = {}
    for d in ("cpu", "tpu"):
        t = (torch.arange(16) * 37 - 200).to(dtype).to(d)
        piece = t.untyped_storage()[start:stop]
        before = piece.tolist()
        piece[1] = 0  # bytes a bool may hold (a tpu bool buffer stores no other byte values)
        piece[2:4] = 1
        got[d] = (before, piece.tolist(), piece.nbytes(), t.cpu())
    assert got["tpu"][:3] == got["cpu"][:3]
    assert torch.equal(got["tpu"][3], got["cpu"][3])


@pytest.mark.parametrize("start", [0, 8, 12])
def test_set_to_a_storage_slice_aliases_like_cpu(start):
    got = {}
    for d in ("cpu", "tpu"):
        base = torch.arange(10, dtype=torch.int32, device=d)
        t = torch.empty(0, dtype=torch.int32, device=d).set_(base.untyped_storage()[start:32])
        assert t.data_ptr() == base.data_ptr() + start
        t.mul_(-1)  # through the alias, into base
        got[d] = (t.cpu(), base.cpu(), t.shape)
    assert torch.equal(got["tpu"][0], got["cpu"][0])
    assert torch.equal(got["tpu"][1], got["cpu"][1])
    assert got["tpu"][2] == got["cpu"][2]


def test_set_to_a_storage_slice_off_an_element_boundary_refused():
    # CPU reads unaligned elements; tpu tensors address whole elements of their storage
    base = torch.arange(10, dtype=torch.int32, device="tpu")
    with pytest.raises(RuntimeError, match="not at a whole element of int"):
        torch.empty(0, dtype=torch.int32, device="tpu").set_(base.untyped_storage()[2:10])


# ---- nondeterminism alerts: CPU's (put_), not the CUDA ones PyTorch's Meta kernels raise ------

def test_deterministic_alerts_like_cpu():
    a = torch.randn(10)
    idx, values = torch.tensor([0, 0]), torch.tensor([0.0, 1.0])
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for d in ("cpu", "tpu"):
            x = torch.randn(10, device=d)
            torch.median(x, 0)  # CUDA's alert ("median CUDA with indices output") only
            torch.median(x)
            x.put(idx.to(d), values.to(d), accumulate=True)  # CUDA's alert only
            with pytest.raises(RuntimeError, match="put_ does not have a deterministic"):
                a.to(d).put_(idx.to(d), values.to(d), accumulate=False)
    finally:
        torch.use_deterministic_algorithms(before)


# ---- convolution's memory format: CPU's (channels-last in, channels-last out) ----------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("conv,shape,fmt", [
    (torch.nn.Conv2d, (2, 3, 8, 8), torch.channels_last),
    (torch.nn.Conv3d, (2, 3, 6, 6, 6), torch.channels_last_3d),
    # batch 1: CPU's float32 3-d convolution leaves oneDNN for its own (contiguous) kernel
    (torch.nn.Conv3d, (1, 3, 6, 6, 6), torch.channels_last_3d),
    (torch.nn.ConvTranspose2d, (2, 3, 8, 8), torch.channels_last),
])
@pytest.mark.parametrize("which", ["input", "weight", "neither"])
def test_conv_memory_format_like_cpu(dtype, conv, shape, fmt, which):
    torch.manual_seed(0)
    ref = conv(3, 4, 3).to(dtype)
    x = torch.randn(*shape, dtype=dtype)
    if which == "input":
        x = x.contiguous(memory_format=fmt)
    strides, grads = {}, {}
    for d in ("cpu", "tpu"):
        m = conv(3, 4, 3).to(dtype)
        m.load_state_dict(ref.state_dict())
        if which == "weight":
            m = m.to(memory_format=fmt)
        m = m.to(d)
        xd = x.detach().to(d).requires_grad_()
        y = m(xd)
        gx, gw, gb = torch.autograd.grad(y, (xd, m.weight, m.bias), torch.ones_like(y))
        strides[d] = (y.stride(), gx.stride(), gw.stride())
        grads[d] = (y.detach().cpu().float(), gx.cpu().float(), gw.cpu().float(),
                    gb.cpu().float())
    assert strides["tpu"] == strides["cpu"]
    tol = dict(atol=5e-2, rtol=5e-2) if dtype is torch.bfloat16 else {}
    for ours, cpus in zip(grads["tpu"], grads["cpu"]):
        torch.testing.assert_close(ours, cpus, **tol)


# ---- randperm's dtype bounds, normal's std tensor, roll's shifts/dims lengths ----------------

@pytest.mark.parametrize("n,dtype", [(129, torch.int8), (257, torch.uint8), (32769, torch.int16),
                                     (2050, torch.float16), (2**24 + 2, torch.float32)])
def test_randperm_out_of_dtype_refused_like_cpu(n, dtype):
    _same_error(lambda d: torch.randperm(n, dtype=dtype, device=d))


@pytest.mark.parametrize("n,dtype", [(128, torch.int8), (256, torch.uint8), (2049, torch.float16)])
def test_randperm_at_the_dtype_bound_like_cpu(n, dtype):
    got = torch.randperm(n, dtype=dtype, device="tpu").cpu()
    assert got.dtype == dtype
    assert torch.equal(got.sort().values, torch.arange(n).to(dtype))


_F32_MAX = torch.finfo(torch.float32).max
_F64_MAX = torch.finfo(torch.float64).max


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.complex64, torch.complex128])
@pytest.mark.parametrize("from_,to", [
    (1.0, -1.0),                       # from > to
    (-_F32_MAX, _F32_MAX),             # to - from beyond float's largest value
    (-_F64_MAX, _F64_MAX),             # out of float's range; to - from is inf in double
    (0.0, 1e5),                        # beyond half's range only
    (float("nan"), 1.0), (0.0, float("inf")), (float("-inf"), 0.0),
])
@pytest.mark.parametrize("size", [(4,), (0,)])
def test_uniform_bounds_refused_like_cpu(dtype, from_, to, size, mode):
    # checked before the tensor's size, except that CPU takes any pair for an empty complex one
    def call(d):
        return torch.empty(size, dtype=dtype, device=d).uniform_(from_, to).cpu()

    expected = raised_by(call, "cpu")
    got = raised_by(call, "tpu")
    if expected is None:
        assert got is None, got
        return
    assert type(got) is type(expected) and str(got) == str(expected), (got, expected)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_uniform_of_non_floating_refused_like_cpu(dtype):
    _same_error(lambda d: torch.empty(3, dtype=dtype, device=d).uniform_())


@pytest.mark.parametrize("dtype,from_,to", [
    (torch.float32, -42.0, _F32_MAX), (torch.float64, -_F64_MAX / 2, _F64_MAX / 2),
    (torch.float32, 3.0, 3.0), (torch.complex64, -2.0, 2.0),
])
def test_uniform_accepted_bounds_draw_in_range(dtype, from_, to):
    got = torch.empty(200, dtype=dtype, device="tpu").uniform_(from_, to).cpu()
    parts = torch.view_as_real(got) if got.is_complex() else got
    assert parts.isfinite().all()
    assert (parts.double() >= from_).all() and (parts.double() <= to).all()


@pytest.mark.parametrize("case", ["scalar_mean", "tensor_mean", "expanded"])
def test_normal_negative_std_tensor_refused_like_cpu(case):
    def call(d):
        std = torch.tensor(-1.0, device=d)
        if case == "scalar_mean":
            return torch.normal(0.0, std)
        if case == "tensor_mean":
            return torch.normal(torch.zeros(3, device=d), std.expand(3))
        return torch.normal(torch.tensor(0.0, device=d), torch.tensor([1.0, -1.0], device=d))

    _same_error(call)
    ok = torch.normal(torch.zeros(3, device="tpu"), torch.ones(3, device="tpu"))
    assert ok.shape == (3,)


@pytest.mark.parametrize("shifts,dims", [((1,), (1, 2)), ((1, 2), (1,)), ((1, 2), ())])
def test_roll_misaligned_refused_like_cpu(shifts, dims):
    _same_error(lambda d: torch.arange(6, device=d).view(2, 3).roll(shifts=shifts, dims=dims))


def test_range_integer_result_with_a_step_below_one_raises_instead_of_crashing():
    # CPU's own torch.range dies of SIGFPE here; tpu refuses it (and arange keeps working)
    with pytest.warns(UserWarning, match="deprecated"):
        with pytest.raises(RuntimeError, match="step must be nonzero"):
            torch.range(0.5, 7.3, 0.7, dtype=torch.int32, device="tpu")
        got = torch.range(0, 7, 2, dtype=torch.int32, device="tpu")
    assert got.cpu().tolist() == [0, 2, 4, 6]
