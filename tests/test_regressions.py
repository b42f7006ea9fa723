"""Fixes of bugs the conformance run found, each checked against CPU."""
import pytest
import torch

TPU = torch.device("tpu")


def test_abs_of_complex_is_the_modulus():
    z = torch.tensor([3 + 4j, -1 - 1j, 0j], dtype=torch.complex64)
    got = torch.abs(z.to(TPU))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.cpu(), torch.abs(z))


@pytest.mark.parametrize("fn", [torch.ceil, torch.floor, torch.round, torch.trunc])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_rounding_is_the_identity_on_integers(fn, dtype):
    x = torch.tensor([1, 7, 0, 5], dtype=dtype)
    got = fn(x.to(TPU))
    assert got.dtype == dtype
    assert torch.equal(got.cpu(), fn(x))


def test_rrelu_eval_matches_cpu_and_training_draws_slopes_in_range():
    x = torch.randn(200)
    torch.testing.assert_close(torch.nn.functional.rrelu(x.to(TPU)).cpu(),
                               torch.nn.functional.rrelu(x))
    lower, upper = 0.1, 0.4
    torch.manual_seed(3)
    y = torch.nn.functional.rrelu(x.to(TPU), lower, upper, training=True).cpu()
    neg = x < 0
    slopes = y[neg] / x[neg]
    assert torch.equal(y[~neg], x[~neg])
    assert slopes.min() >= lower and slopes.max() <= upper and slopes.std() > 0.01
    torch.manual_seed(3)
    again = torch.nn.functional.rrelu(x.to(TPU), lower, upper, training=True).cpu()
    assert torch.equal(y, again)
    assert torch.tpu.fallback_ops().get("aten::rrelu_with_noise") is None


@pytest.mark.parametrize("fn", [torch.tril_indices, torch.triu_indices])
@pytest.mark.parametrize("rco", [(0, 0, 0), (3, 3, 5), (3, 3, -5), (0, 4, 1), (4, 3, 1)])
def test_triangle_indices_including_empty_results(fn, rco):
    got = fn(*rco, device=TPU)
    want = fn(*rco)
    assert got.shape == want.shape and torch.equal(got.cpu(), want)


@pytest.mark.parametrize("n", [65, 150, 600])
def test_ops_with_many_operands(n):
    # the builder printed at most 64 operand types per op (cat/stack of more tensors failed)
    xs = [torch.randn(3, generator=torch.Generator().manual_seed(i)) for i in range(n)]
    tx = [x.to(TPU) for x in xs]
    assert torch.equal(torch.cat(tx).cpu(), torch.cat(xs))
    assert torch.equal(torch.stack(tx, 1).cpu(), torch.stack(xs, 1))


# defer_and_fuse compiles programs of 600-tensor lists (36 s here): outside CI's budget
@pytest.mark.parametrize("mode", ["strict", pytest.param("defer_and_fuse", marks=pytest.mark.long)])
def test_list_ops_longer_than_one_call(mode, fallbacks):
    # one lowered call holds at most 512 tensors; longer lists used to raise "too many tensor
    # arguments" (cat/stack of 600 tensors, _foreach_* and fused optimizers of 600 parameters)
    n = 600
    xs = [torch.randn(2, 3, generator=torch.Generator().manual_seed(i)) for i in range(n)]
    ys = [x * 0.5 for x in xs]
    fallbacks.reset()
    torch.tpu.set_eager_mode(mode)
    try:
        tx, ty = [x.to(TPU) for x in xs], [y.to(TPU) for y in ys]
        out = torch.empty(0, device=TPU)
        torch.cat(tx, 0, out=out)
        assert torch.equal(out.cpu(), torch.cat(xs, 0))
        got = torch._foreach_mul(tx, ty)
        assert len(got) == n and all(torch.equal(g.cpu(), x * y) for g, x, y in zip(got, xs, ys))
        scal = [float(i) for i in range(n)]
        got = torch._foreach_add(tx, scal)
        assert all(torch.equal(g.cpu(), x + s) for g, x, s in zip(got, xs, scal))
        torch._foreach_add_(tx, ty, alpha=2)
        assert all(torch.equal(t.cpu(), x + 2 * y) for t, x, y in zip(tx, xs, ys))
        # fused AdamW over 600 parameters (6 lists of 600 in one call) against CPU's
        params = [torch.nn.Parameter(x.clone()) for x in xs]
        tparams = [torch.nn.Parameter(x.to(TPU)) for x in xs]
        for ps in (params, tparams):
            for p, y in zip(ps, ys):
                p.grad = y.to(p.device)
        cpu_opt = torch.optim.AdamW(params, lr=0.1, fused=True)
        tpu_opt = torch.optim.AdamW(tparams, lr=0.1, fused=True)
        for _ in range(2):
            cpu_opt.step()
            tpu_opt.step()
        for p, t in zip(params, tparams):
            torch.testing.assert_close(t.detach().cpu(), p.detach(), rtol=1e-5, atol=1e-6)
    finally:
        torch.tpu.set_eager_mode("strict")
    fallbacks.assert_none("list ops over 600 tensors")


# ---- fuzzer findings (docs/reliability.md) ----

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64,
                                   torch.bool])
@pytest.mark.parametrize("fn", [torch.sign, torch.sgn])
def test_sign_of_nan_negative_zero_and_bool_f3_f6(fn, dtype):
    if dtype == torch.bool:
        x = torch.tensor([True, False])
    elif dtype.is_floating_point:
        x = torch.tensor([float("nan"), -0.0, 0.0, -2.5, 3.0, float("-inf")], dtype=dtype)
    else:
        x = torch.tensor([-3, 0, 5], dtype=dtype)
    got, ref = fn(x.to(TPU)).cpu(), fn(x)
    assert got.dtype == ref.dtype
    assert torch.equal(got, ref) and torch.equal(got.signbit(), ref.signbit())


@pytest.mark.parametrize("case", [
    lambda d: torch.index_select(torch.zeros(1, 0, dtype=torch.bool, device=d), -1,
                                 torch.tensor([], dtype=torch.int64, device=d)),
    lambda d: torch.gather(torch.zeros(2, 0, device=d), 1, torch.zeros(2, 0, dtype=torch.int64,
                                                                        device=d)),
    lambda d: torch.zeros(0, dtype=torch.int32, device=d)[torch.tensor([], dtype=torch.int64,
                                                                        device=d)],
    lambda d: torch.zeros(3, 0, device=d)[torch.tensor([2, 0], device=d)],
])
def test_gathers_on_empty_dims_f4(case):
    ref = case("cpu")
    got = case(TPU).cpu()
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert torch.equal(got, ref)


@pytest.mark.parametrize("k", [0, 1])
def test_topk_of_a_0d_tensor_f5(k):
    ref = torch.topk(torch.tensor(2.0), k, dim=-1)
    got = torch.topk(torch.tensor(2.0, device=TPU), k, dim=-1)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype
        assert torch.equal(g.cpu(), r)


@pytest.mark.parametrize("values", [(0, 5, 6), (1, 5, 6), (2, 1), (1, 3, 1), (1, 1, 1)])
def test_index_put_value_shape_is_checked_when_nothing_is_written_f8(values):
    def run(d):
        empty = len(values) == 3 and values[1] == 5
        x = torch.zeros(0, 5, 5, device=d) if empty else torch.zeros(3, 1, device=d)
        idx = torch.tensor([], dtype=torch.int64, device=d) if empty else \
            torch.tensor([0], device=d)
        return x.index_put_((idx,), torch.ones(*values, device=d))
    with pytest.raises(RuntimeError) as cpu:
        run("cpu")
    with pytest.raises(RuntimeError) as tpu:
        run(TPU)
    assert str(cpu.value).splitlines()[0] in str(tpu.value)


@pytest.mark.parametrize("dst,src", [((1, 1), (1, 0, 1)), ((), (1,)), ((2, 3), (4,)),
                                     ((0, 1), (0, 2)), ((2, 3), (1, 2, 3)), ((2, 3), (1, 3))])
@pytest.mark.parametrize("src_device", ["tpu", "cpu"])
def test_copy_requires_the_source_to_broadcast_also_when_empty_f8(dst, src, src_device):
    def run(d, sd):
        x = torch.zeros(dst, device=d)
        if dst == (1, 1):
            x = x[3:3]  # an empty view
        return x.copy_(torch.ones(*src, device=sd))
    try:
        ref = run("cpu", "cpu")
    except RuntimeError as e:
        with pytest.raises(RuntimeError) as got:
            run(TPU, src_device if src_device == "cpu" else TPU)
        assert str(got.value).splitlines()[0] == str(e).splitlines()[0]
    else:
        assert torch.equal(run(TPU, src_device if src_device == "cpu" else TPU).cpu(), ref)


def test_take_and_put_on_an_empty_tensor_raise_like_cpu():
    for fn in (lambda d: torch.take(torch.zeros(0, device=d), torch.tensor([0], device=d)),
               lambda d: torch.zeros(0, device=d).put_(torch.tensor([0], device=d),
                                                       torch.ones(1, device=d))):
        with pytest.raises(IndexError) as cpu:
            fn("cpu")
        with pytest.raises(IndexError) as got:
            fn(TPU)
        assert str(cpu.value) in str(got.value)
    x = torch.zeros(0, device=TPU)
    assert torch.take(x, torch.tensor([], dtype=torch.int64, device=TPU)).shape == (0,)


KERNEL_CHECKS = {
    "mm": lambda d: torch.ones(2, 2, device=d) @ torch.ones(2, 2, dtype=torch.bfloat16, device=d),
    "mm_double": lambda d: torch.mm(torch.ones(2, 2, dtype=torch.float64, device=d),
                                    torch.ones(2, 2, device=d)),
    "bmm": lambda d: torch.bmm(torch.ones(1, 2, 2, device=d),
                               torch.ones(1, 2, 2, dtype=torch.bfloat16, device=d)),
    "matmul_3d": lambda d: torch.ones(1, 2, 2, device=d) @ torch.ones(1, 2, 2, dtype=torch.float64,
                                                                     device=d),
    "baddbmm": lambda d: torch.baddbmm(torch.ones(1, 2, 2, device=d), torch.ones(1, 2, 2, device=d),
                                       torch.ones(1, 2, 2, dtype=torch.bfloat16, device=d)),
    "conv1d_bias": lambda d: torch.nn.functional.conv1d(
        torch.ones(1, 2, 3, device=d), torch.ones(1, 2, 1, device=d), torch.ones(2, device=d)),
    "conv_transpose2d_bias": lambda d: torch.nn.functional.conv_transpose2d(
        torch.ones(1, 4, 3, 3, device=d), torch.ones(4, 1, 2, 2, device=d),
        torch.ones(3, device=d), groups=2),
}


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("name", list(KERNEL_CHECKS))
def test_cpu_kernel_checks_raise_at_the_call_in_every_mode_f9(name, mode):
    fn = KERNEL_CHECKS[name]
    with pytest.raises(RuntimeError) as cpu:
        fn("cpu")
    with torch.tpu.eager_mode(mode):
        with pytest.raises(RuntimeError) as got:
            fn(TPU)  # at the call, not at the next flush
    assert str(got.value).splitlines()[0] == str(cpu.value).splitlines()[0]


def test_conv_with_a_right_bias_still_matches_cpu():
    x, w, b = torch.randn(1, 4, 5, 5), torch.randn(4, 2, 3, 3), torch.randn(4)
    torch.testing.assert_close(
        torch.nn.functional.conv_transpose2d(x.to(TPU), w.to(TPU), b.to(TPU), groups=2).cpu(),
        torch.nn.functional.conv_transpose2d(x, w, b, groups=2), rtol=1e-4, atol=1e-5)


_SHIFTS = {
    "<<": lambda a, b: a << b,
    ">>": lambda a, b: a >> b,
    "bitwise_left_shift": torch.bitwise_left_shift,
    "bitwise_right_shift": torch.bitwise_right_shift,
}


@pytest.mark.parametrize("op", sorted(_SHIFTS))
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_shift_operators_are_lowered_with_cpu_semantics(op, dtype):
    # the Python operators are aten ops of their own (__lshift__, __rshift__); a shift by the
    # width or more, and >> of an unsigned type (zeros shifted in), as on CPU
    fn = _SHIFTS[op]
    a = torch.tensor([1, -8, 5, 100, -1, 127], dtype=torch.int64).to(dtype)
    s = torch.tensor([1, 2, 40, 3, 7, 0], dtype=torch.int64).to(dtype)
    before = dict(torch.tpu.fallback_ops())
    for b_cpu, b_tpu in ((s, s.to(TPU)), (2, 2)):
        want = fn(a, b_cpu)
        got = fn(a.to(TPU), b_tpu)
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want)
    x = a.to(TPU)
    x <<= 3
    x >>= s.to(TPU)
    y = a.clone()
    y <<= 3
    y >>= s
    assert torch.equal(x.cpu(), y)
    assert torch.tpu.fallback_ops() == before


@pytest.mark.parametrize("call", [
    lambda x: x << 1, lambda x: x >> 1, lambda x: torch.bitwise_and(x, 1),
    lambda x: torch.bitwise_or(x, x), lambda x: torch.bitwise_not(x),
    lambda x: torch.bitwise_right_shift(x, 2), lambda x: x.int() & 1.5,
])
def test_bitwise_ops_on_floats_raise_not_implemented_like_cpu(call):
    with pytest.raises(NotImplementedError) as cpu_err:
        call(torch.ones(3))
    with pytest.raises(NotImplementedError, match="not implemented for 'Float'"):
        call(torch.ones(3, device=TPU))
    assert "not implemented for 'Float'" in str(cpu_err.value)


def test_in_place_shift_by_a_float_is_the_cast_error_like_cpu():
    for dev in ("cpu", TPU):
        x = torch.ones(3, dtype=torch.int64, device=dev)
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
            x <<= 1.5


def _outcome(fn, dev):
    """(exception type name, None) or ("ok", result on the host)."""
    try:
        r = fn(dev)
        return "ok", r.cpu()
    except Exception as e:
        return type(e).__name__, None


_BOOL = lambda d: torch.tensor([True, False], device=d)  # noqa: E731
_FLT = lambda d: torch.tensor([1.5, -2.0], device=d)  # noqa: E731


@pytest.mark.parametrize("mode", ["strict", "debug"])
@pytest.mark.parametrize("case", [
    lambda d: torch.sub(_BOOL(d), 3.0),          # the Scalar overload (fuzz seed 2000006023)
    lambda d: torch.rsub(_BOOL(d), 3.0),
    lambda d: torch.sub(_BOOL(d), True),
    lambda d: torch.sub(_FLT(d), True),
    lambda d: torch.sub(_FLT(d), _BOOL(d)),      # a bool tensor operand
    lambda d: torch.rsub(_FLT(d), _BOOL(d)),
    lambda d: _BOOL(d) - _BOOL(d),
    lambda d: torch.sub(_FLT(d), 2),             # still computed
    lambda d: torch.rsub(torch.tensor([3, 4], device=d), 1, alpha=2),
])
def test_subtraction_with_a_bool_operand_raises_like_cpu_fuzz_f11(case, mode):
    torch.tpu.set_eager_mode(mode)
    try:
        want, got = _outcome(case, "cpu"), _outcome(case, TPU)
    finally:
        torch.tpu.set_eager_mode("strict")
    assert want[0] == got[0]
    if want[0] == "ok":
        assert got[1].dtype == want[1].dtype and torch.equal(got[1], want[1])


@pytest.mark.parametrize("fn", [torch.softmax, torch.log_softmax])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("shape", [(0,), (2, 0), (3,), ()])
def test_softmax_of_integers_empty_is_returned_else_not_implemented_fuzz_f12(fn, dtype, shape):
    """CPU returns an empty integer input as it is and raises NotImplementedError otherwise;
    tpu failed to compile exp of an integer (fuzz seeds 2000006068, 2000006075)."""
    case = lambda d: fn(torch.zeros(shape, dtype=dtype, device=d), 0)  # noqa: E731
    want, got = _outcome(case, "cpu"), _outcome(case, TPU)
    assert want[0] == got[0]
    if want[0] == "ok":
        assert got[1].dtype == want[1].dtype and got[1].shape == want[1].shape


@pytest.mark.parametrize("fn", [torch.argmin, torch.argmax])
@pytest.mark.parametrize("shape", [(0,), (2,), ()])
def test_argmin_argmax_of_bool_raise_like_cpu_fuzz_f13(fn, shape):
    case = lambda d: fn(torch.zeros(shape, dtype=torch.bool, device=d))  # noqa: E731
    assert _outcome(case, "cpu")[0] == _outcome(case, TPU)[0] == "RuntimeError"
    # other dtypes are unchanged
    x = torch.tensor([[3, 1], [0, 7]])
    assert torch.equal(fn(x.to(TPU), dim=1).cpu(), fn(x, dim=1))


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("shape,reps", [
    ((1, 1, 1, 1, 1), (2, 1, 1, 1, 1)),            # F7: the composite needed rank 10
    ((2, 1, 3, 1, 2), (1, 2, 1, 3, 2, 2)),
    ((1, 2, 1, 2, 1, 2, 1, 2), (2, 1, 1, 1, 1, 1, 1, 3)),   # rank 8: by concatenation
    ((2, 1, 2, 1, 2), (1, 0, 2, 1, 1)),
    ((2, 3), (2, 1, 2)),                           # ranks up to 4 as before
    ((2, 3), (1, 1)),
])
def test_repeat_past_rank_4_matches_cpu_f7(shape, reps, mode):
    x = torch.randn(shape)
    torch.tpu.set_eager_mode(mode)
    try:
        xt = x.to(TPU)
        got = xt.repeat(*reps)
        assert got.untyped_storage().data_ptr() != xt.untyped_storage().data_ptr()
        got = got.cpu()
    finally:
        torch.tpu.set_eager_mode("strict")
    want = x.repeat(*reps)
    assert got.shape == want.shape and got.stride() == want.stride()
    assert torch.equal(got, want)


def test_repeat_of_a_rank_5_tensor_backward_f7():
    x = torch.randn(2, 1, 3, 1, 2, requires_grad=True)
    xt = x.detach().to(TPU).requires_grad_()
    (x.repeat(1, 2, 1, 3, 2) * torch.arange(144.0).reshape(2, 2, 3, 3, 4)).sum().backward()
    (xt.repeat(1, 2, 1, 3, 2) * torch.arange(144.0).reshape(2, 2, 3, 3, 4).to(TPU)).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), x.grad)


@pytest.mark.parametrize("fn", [torch.maximum, torch.minimum])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_maximum_minimum_propagate_nan_from_either_operand_f14(fn, dtype):
    """tpu returned the first operand where only the second was NaN (the CPU plugin's
    stablehlo.maximum/minimum); fuzz seed 2000006293: maximum(x, log(negative) * 0.5)."""
    nan = float("nan")
    y = torch.tensor([[1.0, nan, 2.0], [nan, 3.0, -1.0], [0.5, -0.25, nan]], dtype=dtype)
    z = torch.zeros(1, dtype=dtype)
    for a, b in ((z, y), (y, z), (y.flip(0), y), (y.t(), y)):
        want = fn(a, b)
        got = fn(a.to(TPU), b.to(TPU)).cpu()
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.nan_to_num(7), want.nan_to_num(7))
    out = torch.empty(3, 3, dtype=dtype, device=TPU)
    fn(z.to(TPU), y.to(TPU), out=out)
    assert torch.equal(out.cpu().isnan(), fn(z, y).isnan())


@pytest.mark.parametrize("shape,k", [((), 0), ((0,), 0), ((3,), 2)])
def test_topk_of_bool_raises_like_cpu_f15(shape, k):
    case = lambda d: torch.topk(torch.zeros(shape, dtype=torch.bool, device=d), k)[0]  # noqa: E731
    assert _outcome(case, "cpu")[0] == _outcome(case, TPU)[0] == "RuntimeError"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_product_with_a_false_bool_keeps_nan_and_inf_f16(dtype):
    """False * NaN and False * inf are NaN on CPU; XLA's rewrite of x * convert(pred) into a
    select gave 0 (fuzz seed 2000006459: a bool times var() of one element)."""
    nan, inf = float("nan"), float("inf")
    m = torch.tensor([False, True, False, True, False])
    x = torch.tensor([nan, nan, inf, -2.0, -3.0], dtype=dtype)
    cases = [lambda d: torch.mul(m.to(d), x.to(d)), lambda d: torch.mul(x.to(d), m.to(d)),
             lambda d: m[:1].to(d) * x.to(d), lambda d: x.to(d) * False,
             lambda d: x.to(d).clone().mul_(m.to(d))]
    for case in cases:
        want, got = case("cpu"), case(TPU).cpu()
        assert got.dtype == want.dtype
        assert torch.equal(got.isnan(), want.isnan()), (want, got)
        assert torch.equal(got.nan_to_num(7), want.nan_to_num(7))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_floor_division_of_floats_matches_cpu_with_infinities_and_signed_zeros_f21(dtype):
    """CPU floors through fmod: -inf // 3 is NaN and -1 // inf is -1, where floor(a / b) gave
    -inf and -0 (fuzz seed 2001006141: torch.log(0) // 2 with rounding_mode='floor')."""
    inf, nan = float("inf"), float("nan")
    vals = [0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 7.0, -7.0, 0.3, -0.3, 1e30, -1e30, 3.0, inf, -inf,
            nan]
    a = torch.tensor([x for x in vals for _ in vals], dtype=dtype)
    b = torch.tensor([y for _ in vals for y in vals], dtype=dtype)
    g = torch.Generator().manual_seed(0)
    a = torch.cat([a, (torch.randn(500, generator=g) * 10).to(dtype)])
    b = torch.cat([b, (torch.randn(500, generator=g) * 3).to(dtype)])
    for fn in (lambda p, q: torch.div(p, q, rounding_mode="floor"), torch.floor_divide):
        want, got = fn(a, b), fn(a.to(TPU), b.to(TPU)).cpu()
        assert torch.equal(got.isnan(), want.isnan())
        ok = want.isnan() | ((got == want) & (got.signbit() == want.signbit()))
        assert ok.all(), (a[~ok][:4], b[~ok][:4], want[~ok][:4], got[~ok][:4])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_sums_of_negative_zeros_are_positive_zero_as_on_cpu_fuzz_f22(dtype):
    """CPU's sums start from +0, so they are never -0; XLA turned a sum over one element (or a
    scan's first element) into the element itself and kept -0 (fuzz seed 2000007325:
    `x / t.sum(0)` was -inf on tpu, inf on CPU)."""
    x = torch.tensor([[-0.0, 1.0], [-0.0, -0.0]], dtype=dtype)
    ops = {"sum": lambda t: t.sum(), "sum_dim1": lambda t: t[:, :1].sum(1),
           "sum_rows": lambda t: t[1:].sum(0), "mean": lambda t: t[:, :1].mean(1),
           "nansum": lambda t: t[1:].nansum(1), "cumsum": lambda t: t.cumsum(1),
           "sum_to_float64": lambda t: t[:1, :1].sum(dtype=torch.float64),
           "zero_d_cumsum": lambda t: t[0, 0].cumsum(0)}  # CPU copies a 0-d input: -0 stays
    for name, fn in ops.items():
        want, got = fn(x), fn(x.to(TPU)).cpu()
        assert torch.equal(got, want) and torch.equal(got.signbit(), want.signbit()), \
            (name, want, got)


@pytest.mark.parametrize("mode", [None, "floor", "trunc"])
def test_bool_numerator_over_zero_is_nan_as_on_cpu_fuzz_f23(mode):
    """XLA rewrote convert(pred) / y as select(pred, 1 / y, 0): False / 0 gave 0, not NaN
    (fuzz seed 2000008036: torch.div(bool_t, bool_0d))."""
    a = torch.tensor([False, True, False, True])
    divisors = (0.0, -0.0, torch.tensor(0.0), float("inf"), -1.0)
    if mode is None:  # CPU has no floor or trunc division of two bools
        divisors += (False, torch.tensor(False))
    for d in divisors:
        want = torch.div(a, d, rounding_mode=mode)
        got = torch.div(a.to(TPU), d.to(TPU) if isinstance(d, torch.Tensor) else d,
                        rounding_mode=mode).cpu()
        assert got.dtype == want.dtype and torch.equal(got.isnan(), want.isnan()), (d, want, got)
        assert torch.equal(got.nan_to_num(), want.nan_to_num()), (d, want, got)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32])
@pytest.mark.parametrize("shape", [(0, 1), (2, 3), ()])
def test_softmax_checks_its_dim_first_for_every_dtype_and_size(shape, dtype):
    """An empty integer input with an out-of-range dim returned empty (the F12 shortcut came
    before the dim check); CPU raises IndexError (fuzz seed 2000008664)."""
    x = torch.zeros(shape, dtype=dtype)
    for dim in (2, -3, 1, -1):
        for fn in (torch.softmax, torch.log_softmax):
            try:
                want = fn(x, dim=dim)
            except Exception as e:  # noqa: BLE001 (CPU's exception is the reference)
                with pytest.raises(type(e)):
                    fn(x.to(TPU), dim=dim).cpu()
                continue
            got = fn(x.to(TPU), dim=dim).cpu()
            assert got.dtype == want.dtype and got.shape == want.shape


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool])
def test_abs_and_logical_ops_keep_the_inputs_layout_fuzz_f2(dtype):
    """Their composite kernels called the out= form with an empty tensor, resized row-major;
    CPU's TensorIterator keeps a transposed input's layout (fuzz F2)."""
    x = (torch.randn(3, 4) * 3).to(dtype).t()
    ops = {"abs": torch.abs, "logical_not": torch.logical_not,
           "logical_and": lambda t: torch.logical_and(t, t),
           "logical_or": lambda t: torch.logical_or(t, t[:, :1]),
           "logical_xor": lambda t: torch.logical_xor(t, t.flip(0))}
    for name, fn in ops.items():
        if name == "abs" and dtype == torch.bool:
            continue  # CPU has no abs of bools (test_dtypes_cpu_has_no_kernel_for_...)
        want, got = fn(x), fn(x.to(TPU))
        assert got.stride() == want.stride() and got.dtype == want.dtype, (name, want, got)
        assert torch.equal(got.cpu(), want), name


_B = [True, False, True]
_NO_KERNEL = {  # CPU raises for these dtypes (fuzz F1): tpu computed or failed to compile
    "floor_bool": lambda d: torch.floor(torch.tensor(_B, device=d)),
    "ceil_bool": lambda d: torch.ceil(torch.tensor(_B, device=d)),
    "round_bool": lambda d: torch.round(torch.tensor(_B, device=d)),
    "trunc_bool": lambda d: torch.trunc(torch.tensor(_B, device=d)),
    "fix_bool": lambda d: torch.fix(torch.tensor(_B, device=d)),
    "floor__bool": lambda d: torch.tensor(_B, device=d).floor_(),
    "abs_bool": lambda d: torch.abs(torch.tensor(_B, device=d)),
    "relu_bool": lambda d: torch.relu(torch.tensor(_B, device=d)),
    "round_decimals_int": lambda d: torch.round(torch.tensor([1, 2], device=d), decimals=1),
    "round_decimals_0_int": lambda d: torch.round(torch.tensor([1, 2], device=d), decimals=0),
    "remainder_bool": lambda d: torch.remainder(torch.tensor(_B, device=d), torch.tensor(_B, device=d)),
    "fmod_bool": lambda d: torch.fmod(torch.tensor(_B, device=d), True),
    "div_trunc_bool": lambda d: torch.div(torch.tensor(_B, device=d), False, rounding_mode="trunc"),
    "pow_bool": lambda d: torch.pow(torch.tensor(_B, device=d), torch.tensor(_B, device=d)),
    "gcd_bool": lambda d: torch.gcd(torch.tensor(_B, device=d), torch.tensor(_B, device=d)),
    "hypot_int": lambda d: torch.hypot(torch.tensor([3, 4], device=d), torch.tensor([4, 3], device=d)),
    "nextafter_int": lambda d: torch.nextafter(torch.tensor([1], device=d), torch.tensor([2], device=d)),
}
_HAS_KERNEL = {  # neighbours CPU computes: tpu must too, with CPU's values and dtypes
    "round_int": lambda d: torch.round(torch.tensor([1, -2], device=d)),
    "pow_bool_int": lambda d: torch.pow(torch.tensor(_B, device=d), 2),
    "remainder_bool_int": lambda d: torch.remainder(torch.tensor(_B, device=d), 1),
    "hypot_int_float": lambda d: torch.hypot(torch.tensor([3, 4], device=d), torch.tensor(4.0, device=d)),
    "sign_bool": lambda d: torch.sign(torch.tensor(_B, device=d)),
    # unsigned integers: stablehlo.abs and stablehlo.sign reject them (a compile error before)
    "abs_uint8": lambda d: torch.abs(torch.tensor([0, 7, 200], dtype=torch.uint8, device=d)),
    "sign_uint8": lambda d: torch.sign(torch.tensor([0, 7, 200], dtype=torch.uint8, device=d)),
    "sgn_uint8": lambda d: torch.sgn(torch.tensor([0, 7, 200], dtype=torch.uint8, device=d)),
    "gcd_uint8": lambda d: torch.gcd(torch.tensor([12, 0, 200], dtype=torch.uint8, device=d),
                                     torch.tensor([18, 5, 150], dtype=torch.uint8, device=d)),
    "lcm_uint8": lambda d: torch.lcm(torch.tensor([4, 0, 6], dtype=torch.uint8, device=d),
                                     torch.tensor([6, 5, 10], dtype=torch.uint8, device=d)),
}


@pytest.mark.parametrize("mode", ["strict", "debug"])
@pytest.mark.parametrize("name", list(_NO_KERNEL))
def test_dtypes_cpu_has_no_kernel_for_raise_cpus_error_fuzz_f1(name, mode):
    fn = _NO_KERNEL[name]
    with pytest.raises(Exception) as ce:
        fn("cpu")
    with torch.tpu.eager_mode(mode):
        with pytest.raises(Exception) as te:
            fn(TPU).cpu()
    assert te.type is ce.type, (ce.value, te.value)
    assert "compile" not in str(te.value), te.value


@pytest.mark.parametrize("name", list(_HAS_KERNEL))
def test_dtypes_cpu_has_a_kernel_for_compute_like_cpu_fuzz_f1(name):
    want, got = _HAS_KERNEL[name]("cpu"), _HAS_KERNEL[name](TPU).cpu()
    assert got.dtype == want.dtype and torch.equal(got, want), (want, got)


@pytest.mark.parametrize("case", ["min_empty_dim", "softmax_bad_dim", "sort_bad_dim"])
def test_debug_mode_keeps_the_exception_type_fuzz_f20(case):
    # Debug mode names the op, its inputs and the line in its error; it used to raise that as a
    # RuntimeError whatever CPU raised (IndexError here).
    ops = {"min_empty_dim": lambda t: torch.min(t, dim=0),
           "softmax_bad_dim": lambda t: torch.softmax(t, dim=3),
           "sort_bad_dim": lambda t: torch.sort(t, dim=-4)}
    x = torch.zeros(0, 1) if case == "min_empty_dim" else torch.zeros(2, 3)
    with pytest.raises(Exception) as ce:
        ops[case](x)
    with torch.tpu.eager_mode("debug"):
        with pytest.raises(Exception) as te:
            ops[case](x.to("tpu"))
    assert te.type is ce.type, (ce.value, te.value)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "debug"])
def test_addmm_operand_dtypes_raise_cpus_error_at_the_call(mode):
    # tpu accepted addmm(float32 self, float64 mat1, float64 mat2) and, in defer_and_fuse,
    # raised the other mixes only when the recorded ops ran
    a, b, c = torch.randn(2, 3), torch.randn(3, 4), torch.randn(2, 4)
    cases = [(c, a, b.double()), (c.double(), a, b.double()), (c, a.double(), b.double()),
             (c.double(), a.double(), b)]
    with torch.tpu.eager_mode(mode):
        for args in cases:
            with pytest.raises(RuntimeError) as ce:
                torch.addmm(*args)
            with pytest.raises(RuntimeError) as te:
                torch.addmm(*[t.to("tpu") for t in args])
            assert str(te.value) == str(ce.value)


@pytest.mark.parametrize("n", [12, 1000])
@pytest.mark.parametrize("value", [0.7364, 2.1, -3.3, 1e-3, 123.456])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_of_a_constant_row_is_the_bias_fuzz_f19(value, n, dtype):
    """CPU's mean of a constant row is exact, so x - mean is 0 and layer_norm gives the bias;
    tpu's sum / n was an ulp off and var = 0 amplified it by 1 / sqrt(eps) (fuzz seed
    2000006402: 0.499943 for a bias of 0.5)."""
    x = torch.full((2, n), value, dtype=dtype)
    w, b = torch.full((n,), 3.0, dtype=dtype), torch.full((n,), 0.5, dtype=dtype)
    want = torch.native_layer_norm(x, [n], w, b, 1e-5)
    got = [t.cpu() for t in torch.native_layer_norm(x.to(TPU), [n], w.to(TPU), b.to(TPU), 1e-5)]
    assert torch.equal(got[1], want[1])                       # the mean
    torch.testing.assert_close(got[2], want[2])               # rstd = rsqrt(eps)
    if dtype == torch.float32:
        assert torch.equal(got[0], want[0])
    else:
        # CPU's bfloat16 kernel rounds x * rstd - mean * rstd (up to 5e-3 here), so the exact
        # result (CPU in float64: the bias) is the reference, CPU's within bfloat16's tolerance
        exact = torch.native_layer_norm(x.double(), [n], w.double(), b.double(), 1e-5)[0]
        assert torch.equal(got[0], exact.to(dtype))
        torch.testing.assert_close(got[0], want[0], rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("value", [0.7364, 2.1, -3.3, 123.456])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_group_and_batch_norm_of_a_constant_channel_fuzz_f19(value, dtype):
    """group_norm / batch_norm (training) / instance_norm had F19's sum / n mean. CPU's mean
    (and so rstd) of a constant group or channel is exact; its output x * scale + shift rounds
    the two products (0.4971 for a bias of 0.5 at 123.456), so the output's reference is CPU in
    float64, the bias."""
    x = torch.full((2, 6, 5), value, dtype=dtype)
    w, b = torch.full((6,), 3.0, dtype=dtype), torch.full((6,), 0.5, dtype=dtype)
    cases = {
        "group": lambda t, w, b: torch.native_group_norm(t, w, b, 2, 6, 5, 3, 1e-5),
        "batch": lambda t, w, b: torch.native_batch_norm(t, w, b, None, None, True, 0.1, 1e-5),
        "instance": lambda t, w, b: (torch.nn.functional.instance_norm(t, weight=w, bias=b),),
    }
    for name, fn in cases.items():
        want = fn(x, w, b)
        got = [t.cpu() for t in fn(x.to(TPU), w.to(TPU), b.to(TPU))]
        exact = fn(x.double(), w.double(), b.double())[0].to(dtype)
        assert torch.equal(got[0], exact), name
        if len(want) > 1:
            assert torch.equal(got[1], want[1]), name              # the mean
            torch.testing.assert_close(got[2], want[2])            # rstd


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_of_infinities_and_nan_as_on_cpu(dtype, approximate):
    """CPU's erf-form gelu gives NaN at +inf below float64 (fuzz seed 2000010566: gelu of
    True / False); tpu gave inf."""
    x = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 1.5, -3.0],
                     dtype=dtype)
    want = torch.nn.functional.gelu(x, approximate=approximate)
    got = torch.nn.functional.gelu(x.to(TPU), approximate=approximate).cpu()
    if (dtype == torch.float16 and approximate == "none" and not want[0].isnan()
            and got[0].isnan()) or (dtype == torch.float16 and approximate == "none"
                                    and want[0].isnan() and got[0] == float("inf")):
        # Known difference, host-dependent: CPU's own float16 gelu(+inf) is inf on some hosts
        # and NaN on others (NaN on an Intel Xeon with AVX512-FP16, where PyTorch's
        # vectorized float16 kernel runs; inf where earlier runs of this test passed); the
        # tpu program's value is one of the two. The other six elements must still match.
        x, want, got = x[1:], want[1:], got[1:]
    assert torch.equal(got.isnan(), want.isnan()), (want, got)
    torch.testing.assert_close(got, want, equal_nan=True)


FILL_CASES = {
    "full_int8_1000": lambda d: torch.full((2,), 1000, dtype=torch.int8, device=d),
    "full_int8_100": lambda d: torch.full((2,), 100, dtype=torch.int8, device=d),
    "fill_half_1e10": lambda d: torch.zeros(2, dtype=torch.float16, device=d).fill_(1e10),
    "fill_half_inf": lambda d: torch.zeros(2, dtype=torch.float16, device=d).fill_(float("inf")),
    "masked_fill_uint8_minus1": lambda d: torch.zeros(2, dtype=torch.uint8, device=d).masked_fill(
        torch.tensor([True, False], device=d), -1),
    "new_full_int8_300": lambda d: torch.zeros(2, dtype=torch.int8, device=d).new_full((3,), 300),
    "full_like_int8_300": lambda d: torch.full_like(torch.zeros(2, dtype=torch.int8, device=d), 300),
    "index_fill_int8_999": lambda d: torch.zeros(2, 2, dtype=torch.int8, device=d).index_fill_(
        0, torch.tensor([0], device=d), 999),
    "full_float_1e300": lambda d: torch.full((2,), 1e300, device=d),
    # float8 fills keep their own check (lowp_ops.cpp); the standard one must not refuse them
    "fill_float8_1": lambda d: torch.zeros(2, dtype=torch.float8_e4m3fn, device=d).fill_(1.0).float(),
    "full_float8_500": lambda d: torch.full((2,), 500.0, dtype=torch.float8_e4m3fn, device=d).float(),
}


@pytest.mark.parametrize("case", sorted(FILL_CASES))
def test_fill_values_that_do_not_fit_raise_like_cpu(case, mode):
    # CPU's fill kernels convert the value with a checked conversion; tpu wrapped it silently
    # (torch.full((2,), 1000, dtype=torch.int8) gave -24)
    fn = FILL_CASES[case]
    try:
        want = fn("cpu")
    except RuntimeError as e:
        with pytest.raises(RuntimeError, match="without overflow"):
            fn("tpu").cpu()
        assert "without overflow" in str(e)
        return
    got = fn("tpu").cpu()
    assert got.dtype == want.dtype and torch.equal(got, want)


PRODUCTS = {
    "mm": lambda a, b: torch.mm(a[0], b[0]),
    "bmm": torch.bmm,
    "matmul": torch.matmul,
    "linear": lambda a, b: torch.nn.functional.linear(a[0], b[0].t()),
    "einsum": lambda a, b: torch.einsum("bij,bjk->bik", a, b),
    "mv": lambda a, b: torch.mv(b[0].t(), a[0, 0]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("op", sorted(PRODUCTS))
def test_zero_products_are_positive_zero_as_on_cpu(op, mode, dtype):
    # fuzz seed 2000015671: bmm of zeros by negatives gave -0.0 (XLA's CPU dot), so atan2 of
    # it gave -pi where CPU gives 0; CPU's sums of products start from +0
    a = torch.zeros(1, 2, 4, dtype=dtype)
    b = -torch.rand(1, 4, 3, dtype=torch.float64).add(0.5).to(dtype)
    with torch.tpu.eager_mode(mode):
        got = PRODUCTS[op](a.to(TPU), b.to(TPU))
        angle = torch.atan2(got, got).cpu()
    want = PRODUCTS[op](a, b)
    assert torch.equal(torch.signbit(got.cpu()), torch.signbit(want)), got.cpu()
    assert torch.equal(angle, torch.atan2(want, want))
