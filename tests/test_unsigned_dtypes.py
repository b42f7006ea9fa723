"""PyTorch's "barebones" unsigned dtypes (uint16, uint32, uint64) on tpu, against CPU: creation,
host copies, conversions, view(dtype) to and from every dtype (with aliasing), view copies, the
ops CPU has kernels for on them, the float ops CPU promotes them into, and CPU's refusals (same
exception type). csrc/bridge/unsigned_ops.cpp holds the table these tests check."""
import warnings

import pytest
import torch

import torch_pjrt  # noqa: F401
from conftest import like_cpu_with

TPU = torch.device("tpu")
U = [torch.uint16, torch.uint32, torch.uint64]
EVERY = U + [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
             torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
             torch.complex128]


def values(dt):
    """12 values of dt: small ones, byte boundaries, the top of the range (past int64's for
    uint64, as bits)."""
    m = torch.iinfo(dt).max
    return torch.tensor([0, 1, 2, 3, 255, 256, 1000, m // 2, m - 1, m, 7, 5], dtype=dt)


def reversed_values(dt):
    return torch.tensor(list(reversed(values(dt).tolist())), dtype=dt)  # CPU has no flip


def assert_same(got, want):
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.is_floating_point() or want.is_complex():
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    else:
        assert torch.equal(got, want), f"{got.tolist()} != {want.tolist()}"


def like_cpu(f, *args):
    """f on CPU tensors and on their tpu copies: CPU's values, or CPU's exception type."""
    like_cpu_with(assert_same, f, *args)


@pytest.mark.parametrize("dt", U, ids=str)
def test_creation_and_host_copies(dt, fallbacks):
    m = torch.iinfo(dt).max
    like_cpu(lambda x: torch.zeros(2, 3, dtype=dt, device=x.device), torch.empty(0))
    like_cpu(lambda x: torch.ones(4, dtype=dt, device=x.device), torch.empty(0))
    like_cpu(lambda x: torch.full((3,), m, dtype=dt, device=x.device), torch.empty(0))
    like_cpu(lambda x: torch.full((3,), 7, dtype=dt, device=x.device), torch.empty(0))
    e = torch.empty(2, 5, dtype=dt, device=TPU)
    assert e.dtype == dt and e.shape == (2, 5) and e.device.type == "tpu"
    v = values(dt)
    assert_same(v.to(TPU), v)  # host -> device -> host, the top bits included
    like_cpu(lambda x: x.clone().fill_(m), v)
    like_cpu(lambda x: x.clone().zero_(), v)
    assert v.to(TPU)[9].item() == m
    fallbacks.assert_none()


@pytest.mark.parametrize("dt", U, ids=str)
def test_conversions(dt, fallbacks):
    v = values(dt)
    for other in EVERY:
        like_cpu(lambda x: x.to(other), v[:7])  # values every dtype holds (bool: nonzero)
    like_cpu(lambda x: x.to(torch.int64), v)  # the top of uint64 wraps to negative, as on CPU
    like_cpu(lambda x: x.double(), v)
    # into dt: integers wrap modulo 2^bits (CPU's rule), in-range floats truncate
    like_cpu(lambda x: x.to(dt), torch.tensor([-1, 0, 5, 70000, 2**40, -(2**40)]))
    like_cpu(lambda x: x.to(dt), torch.tensor([0.0, 1.5, 200.7, 65535.0]))
    like_cpu(lambda x: x.to(dt), torch.tensor([True, False]))
    # copy_ between devices and dtypes, into strided views
    like_cpu(lambda x, y: (x.view(3, 4)[:, 1].copy_(y[:3]), x)[1], v.clone(), reversed_values(dt))
    like_cpu(lambda x, y: (x.copy_(y), x)[1], v.clone(), torch.arange(12.0))
    d = v.to(TPU)
    d[1:4].copy_(torch.tensor([9, 8, 7], dtype=dt))  # from a CPU tensor into a tpu view
    w = v.clone()
    w[1:4] = torch.tensor([9, 8, 7], dtype=dt)
    assert_same(d, w)
    fallbacks.assert_none()


@pytest.mark.parametrize("dt", U, ids=str)
@pytest.mark.parametrize("other", EVERY, ids=str)
def test_view_dtype_both_ways(dt, other, fallbacks):
    a, b = torch.tensor(0, dtype=dt).element_size(), torch.tensor(0, dtype=other).element_size()
    n = 48  # a multiple of every size ratio
    base = values(dt).repeat(4)[:n].view(4, n // 4)
    like_cpu(lambda x: x.view(other), base)
    like_cpu(lambda x: x[:, 2:].view(other), base)  # a view at an offset
    # from other's bytes: every bit pattern of the first bytes, reinterpreted as dt
    raw = torch.arange(n * max(a, b), dtype=torch.int64).remainder(256).to(torch.uint8)
    src = raw.view(other) if other != torch.bool else raw.remainder(2).bool()
    like_cpu(lambda x: x.view(-1, 8).view(dt), src)
    # CPU's refusal where the last dim is not a whole number of the larger dtype
    like_cpu(lambda x: x[:, :1].view(other) if b > a else x.view(other), base)
    fallbacks.assert_none()


@pytest.mark.parametrize("dt", U, ids=str)
def test_view_dtype_aliases(dt):
    """A write through a view of another dtype changes the base, and the reverse."""
    v = values(dt)
    for other in [torch.uint8, torch.int16, torch.int64, torch.float32, U[(U.index(dt) + 1) % 3]]:
        c, d = v.clone(), v.to(TPU)
        cv, dv = c.view(other), d.view(other)
        cv[1] = 3
        dv[1] = 3
        assert_same(d, c)  # the base sees the view's write
        c[:1] = v[9:10]  # the top value (past int64 for uint64: no Python int setitem)
        d[:1] = v[9:10].to(TPU)
        assert_same(dv, cv)  # the view sees the base's write
        c.view(other).mul_(0)  # an in-place op on the view of another dtype
        d.view(other).mul_(0)
        assert_same(d, c)


@pytest.mark.parametrize("dt", U, ids=str)
def test_view_copies(dt, fallbacks):
    v, w = values(dt), reversed_values(dt)
    like_cpu(lambda x: x.view(3, 4).t().contiguous(), v)
    like_cpu(lambda x: x.view(2, 3, 2).permute(2, 0, 1).reshape(-1), v)
    like_cpu(lambda x: x.as_strided((3, 2), (1, 3)).contiguous(), v)
    like_cpu(lambda x, y: torch.cat([x, y]), v, w)
    like_cpu(lambda x, y: torch.stack([x, y], 1), v, w)
    like_cpu(lambda x: x[torch.tensor([0, 9, 2], device=x.device)], v)
    like_cpu(lambda x: x.view(3, 4)[1:, ::2], v)
    like_cpu(lambda x: x[:3].view(1, 3).expand(2, 3).contiguous(), v)
    like_cpu(lambda x: x.repeat(2), v)
    like_cpu(lambda x: x.roll(1), v)
    like_cpu(lambda x, y: x[x == y], v, v)  # a boolean mask
    fallbacks.assert_none()


@pytest.mark.parametrize("dt", U, ids=str)
def test_ops_cpu_has(dt, fallbacks):
    v, w = values(dt), reversed_values(dt)
    three = torch.full((12,), 3, dtype=dt)
    for f in [lambda x, y: x == y, lambda x, y: x != y, lambda x, y: x == 1,
              lambda x, y: x == torch.iinfo(dt).max, lambda x, y: x * y, lambda x, y: x * 3,
              lambda x, y: x & y, lambda x, y: x | y, lambda x, y: x ^ y, lambda x, y: x & 6,
              lambda x, y: torch.where(x == y, x, y), lambda x, y: torch.equal(x, y)]:
        like_cpu(f, v, w)
    like_cpu(lambda x, y: x / y, v, three)  # true division: float32
    for f in [lambda x: x.sum(), lambda x: x.view(3, 4).sum(1), lambda x: x[:4].prod(),
              lambda x: x.cumsum(0), lambda x: x.any(), lambda x: x.all(), lambda x: x.isnan(),
              lambda x: x.ceil(), lambda x: x.floor(), lambda x: x.trunc(),
              lambda x: x.sort(), lambda x: x.sort(descending=True), lambda x: x.unique()]:
        like_cpu(f, v)
    # ops CPU runs in float32 (a float operand; an op that promotes integers)
    like_cpu(lambda x: x[:8] + 1.5, v)
    like_cpu(lambda x: x[:8] < 2.5, v)
    like_cpu(lambda x, y: x[:8] - y[:8], v, torch.arange(8.0))
    like_cpu(lambda x: x[:8].sqrt(), v)
    like_cpu(lambda x, y: torch.copysign(x[:8], y[:8]), v, w)
    fallbacks.assert_none()


REFUSED = {  # CPU has no kernel for these on uint16/32/64, or refuses the promotion
    "add": lambda x, y: x + y, "sub": lambda x, y: x - y, "add_scalar": lambda x, y: x + 1,
    "lt": lambda x, y: x < y, "gt_scalar": lambda x, y: x > 1, "neg": lambda x, y: -x,
    "abs": lambda x, y: x.abs(), "max": lambda x, y: x.max(),
    "maximum": lambda x, y: torch.maximum(x, y), "flip": lambda x, y: x.flip(0),
    "rshift": lambda x, y: x >> 1, "invert": lambda x, y: ~x,
    "masked_fill": lambda x, y: x.masked_fill(x == y, 3),
    "index_select": lambda x, y: x.index_select(0, torch.tensor([1], device=x.device)),
    "masked_select": lambda x, y: x.masked_select(x == x),  # (no selection: no error)
    "div_floor": lambda x, y: torch.div(x, y, rounding_mode="floor"),
    "mul_int64": lambda x, y: x * torch.ones(12, dtype=torch.int64, device=x.device),
    "eq_int32": lambda x, y: x == torch.ones(12, dtype=torch.int32, device=x.device),
    "eq_bool": lambda x, y: x == torch.ones(12, dtype=torch.bool, device=x.device),
    "cat_int64": lambda x, y: torch.cat([x, y.to(torch.int64)]),
}


@pytest.mark.parametrize("dt", U, ids=str)
@pytest.mark.parametrize("op", REFUSED)
def test_cpu_refusals(dt, op):
    """What CPU has no kernel for raises on tpu too (CPU's NotImplementedError and promotion
    RuntimeError), whether or not the CPU fallback is allowed."""
    f, v, w = REFUSED[op], values(dt), reversed_values(dt)
    with pytest.raises(Exception) as cpu_error:
        f(v, w)
    with pytest.raises(cpu_error.type), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f(v.to(TPU), w.to(TPU))
        torch.tpu.synchronize()


@pytest.mark.parametrize("dt", U, ids=str)
def test_programs_keyed_by_dtype(dt):
    """The same op on the same shape in each unsigned dtype (and int of the same size) runs
    its own program: a cache key that ignored the dtype would return another dtype's bits."""
    same_size = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}
    for t in [same_size[dt], dt] + U:
        x = torch.tensor([1, 2, 3], dtype=t)
        assert_same((x.to(TPU) * 2), x * 2)
        assert_same(x.to(TPU).view(torch.uint8), x.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_random_from_to_runs_on_tpu_within_bounds(dtype, fallbacks):
    """random_(from, to) is CPU's from-to kernel, which takes these dtypes: lowered, every
    value of [from, to) drawn; random_() without bounds raises CPU's NotImplementedError."""
    t = torch.empty(4000, dtype=dtype, device="tpu").random_(3, 10)
    assert t.dtype == dtype
    v = t.cpu().long()
    assert int(v.min()) == 3 and int(v.max()) == 9 and len(v.unique()) == 7
    fallbacks.assert_none()
    with pytest.raises(NotImplementedError, match="random_kernel_cpu"):
        torch.empty(4, dtype=dtype).random_()
    with pytest.raises(NotImplementedError):
        torch.empty(4, dtype=dtype, device="tpu").random_()


POLYNOMIALS = ["chebyshev_polynomial_t", "shifted_chebyshev_polynomial_v",
               "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p"]


@pytest.mark.parametrize("name", POLYNOMIALS)
@pytest.mark.parametrize("dt", [torch.uint16, torch.uint32])
def test_orthogonal_polynomials_of_unsigned_operands(name, dt, fallbacks):
    """CPU computes them in float32 for unsigned operands of one dtype and refuses to promote
    an unsigned dtype with another integer type; tpu lowers them the same way (no fallback)."""
    f = getattr(torch.special, name)
    x, n = torch.tensor([0, 1, 2, 5], dtype=dt), torch.tensor([0, 1, 3, 4], dtype=dt)
    want = f(x, n)
    got = f(x.to(TPU), n.to(TPU))
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.cpu(), want)
    with pytest.raises(RuntimeError, match="Promotion for uint16, uint32, uint64 types"):
        f(x, n.long())
    with pytest.raises(RuntimeError, match="Promotion for uint16, uint32, uint64 types"):
        f(x.to(TPU), n.long().to(TPU))
    fallbacks.assert_none()


# torch.special's functions of one tensor (and i0, logit, polygamma, logsumexp): CPU converts
# integer input to float32 and runs its float kernel, at every unsigned dtype
SPECIAL_UNARY = {
    name: (lambda name: lambda x: getattr(torch.special, name)(x))(name)
    for name in ["airy_ai", "bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "entr",
                 "erfcx", "i0", "i0e", "i1", "i1e", "log_ndtr", "modified_bessel_i0",
                 "modified_bessel_i1", "modified_bessel_k0", "modified_bessel_k1", "ndtr",
                 "ndtri", "scaled_modified_bessel_k0", "scaled_modified_bessel_k1",
                 "spherical_bessel_j0", "logit", "expit", "gammaln", "digamma", "erfinv"]
}
SPECIAL_UNARY["polygamma_2"] = lambda x: torch.special.polygamma(2, x)
SPECIAL_UNARY["logsumexp"] = lambda x: torch.special.logsumexp(x, 0)


def close(got, want):
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("dt", U, ids=str)
@pytest.mark.parametrize("name", sorted(SPECIAL_UNARY))
def test_special_functions_of_an_unsigned_tensor(name, dt, fallbacks):
    x = torch.tensor([0, 1, 2, 3, 5, 9, 30], dtype=dt)
    like_cpu_with(close, SPECIAL_UNARY[name], x)
    fallbacks.assert_none(name)


SPECIAL_BINARY = {
    "zeta": torch.special.zeta, "xlogy": torch.special.xlogy,
    "xlog1py": torch.special.xlog1py, "hermite_polynomial_h": torch.special.hermite_polynomial_h,
}
OPERANDS = {  # (x, y) given one unsigned tensor each of x and y, on CPU or tpu
    "tensors": lambda x, y: (x, y),
    "float_scalar": lambda x, y: (x, 2.5),
    "int_scalar": lambda x, y: (x, 2),
    "scalar_first": lambda x, y: (3, y),
    "float32_tensor": lambda x, y: (x, y.float()),
}


@pytest.mark.parametrize("dt", U, ids=str)
@pytest.mark.parametrize("operands", sorted(OPERANDS))
@pytest.mark.parametrize("name", sorted(SPECIAL_BINARY))
def test_special_functions_of_unsigned_operands(name, operands, dt, fallbacks):
    """float32 on CPU for unsigned operands (with each other, Python numbers, float tensors),
    and so on tpu, lowered; out= too."""
    f, pick = SPECIAL_BINARY[name], OPERANDS[operands]
    x, y = torch.tensor([1, 2, 3, 7, 40], dtype=dt), torch.tensor([3, 2, 5, 1, 2], dtype=dt)
    like_cpu_with(close, lambda a, b: f(*pick(a, b)), x, y)
    like_cpu_with(close, lambda a, b: f(*pick(a, b), out=torch.empty(5, device=a.device)), x, y)
    fallbacks.assert_none(name)


@pytest.mark.parametrize("dt", U, ids=str)
@pytest.mark.parametrize("name", sorted(SPECIAL_BINARY) + ["gammainc"])
def test_special_functions_refuse_promotion_like_cpu(name, dt):
    f = getattr(torch.special, name)
    x = torch.tensor([1, 2], dtype=dt)
    with pytest.raises(RuntimeError, match="Promotion for uint16, uint32, uint64") as want:
        f(x, x.long())
    with pytest.raises(RuntimeError) as got:
        f(x.to(TPU), x.long().to(TPU))
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("dt", U, ids=str)
def test_incomplete_gamma_of_unsigned_operands(dt, fallbacks):
    """CPU has no integer kernel for igamma/igammac ("igamma_cpu" not implemented for
    'UInt16'), but with a float32 operand runs its float one: lowered then."""
    x, y = torch.tensor([1, 2, 5], dtype=dt), torch.tensor([0.5, 2.0, 7.0])
    for f in (torch.special.gammainc, torch.special.gammaincc):
        like_cpu_with(close, f, x, y)
        like_cpu_with(close, f, y, x)
    fallbacks.assert_none()
    for f in (torch.special.gammainc, torch.special.gammaincc):
        with pytest.raises(NotImplementedError), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            f(x.to(TPU), x.to(TPU))
