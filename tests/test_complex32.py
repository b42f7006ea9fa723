"""torch.complex32 (ComplexHalf) on tpu, against CPU: creation, host and device copies, conversions
to and from every dtype, view_as_real / view_as_complex and other views (aliasing: a write
through one is seen by the others), item, fill_, cat, the arithmetic and comparisons CPU has
kernels for, and CPU's refusals (same exception type). A complex32 storage holds float16
(real, imag) pairs on the device; csrc/bridge/complex32_ops.cpp holds the table of ops these
tests check against CPU."""
import warnings

import pytest
import torch

import torch_pjrt  # noqa: F401
from conftest import like_cpu_with

TPU = torch.device("tpu")
C32 = torch.complex32

warnings.filterwarnings("ignore", message="ComplexHalf support is experimental")
warnings.filterwarnings("ignore", message="Casting complex values to real")

EVERY = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
         torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
         torch.complex128]


def sample(*shape, seed=0):
    """complex32 values with both parts in (-4, 4), a few exact ones and a NaN."""
    g = torch.Generator().manual_seed(seed)
    parts = (torch.rand(*shape, 2, generator=g) * 8 - 4).half()
    flat = parts.view(-1)
    if flat.numel() >= 6:
        flat[:6] = torch.tensor([1.0, -2.0, 0.5, 0.0, float("nan"), 3.0]).half()
    return torch.view_as_complex(parts)


def parts(t):
    """t's values as float64 (real, imag) pairs (NaN kept)."""
    t = t.cpu().resolve_conj()
    return torch.view_as_real(t.to(torch.complex128)) if t.is_complex() else t.double()


def assert_same(got, want, atol=0.0, rtol=0.0):
    assert isinstance(got, torch.Tensor) and got.device.type == "tpu"
    got = got.cpu()
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.is_floating_point() or want.is_complex():
        torch.testing.assert_close(parts(got), parts(want), atol=atol, rtol=rtol, equal_nan=True)
    else:
        assert torch.equal(got, want), f"{got.tolist()} != {want.tolist()}"


def like_cpu(f, *args, atol=0.0, rtol=0.0):
    """f on CPU tensors and on their tpu copies: CPU's values, or CPU's exception type."""
    like_cpu_with(lambda got, want: assert_same(got, want, atol=atol, rtol=rtol), f, *args)


# ---- creation ----------------------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda d: torch.zeros(2, 3, dtype=C32, device=d),
    lambda d: torch.ones(4, dtype=C32, device=d),
    lambda d: torch.full((3, 2), 1.5 - 2j, dtype=C32, device=d),
    lambda d: torch.full((2,), 7, dtype=C32, device=d),
    lambda d: torch.scalar_tensor(2.5, dtype=C32, device=d),
    lambda d: torch.tensor([1 + 1j, -0.5j], dtype=C32, device=d),
    lambda d: torch.zeros_like(torch.ones(3, device=d), dtype=C32),
    lambda d: torch.ones(2, 2, device=d).new_full((3,), 2j, dtype=C32),
    lambda d: torch.full((2,), 1e6, dtype=C32, device=d),  # inf, as CPU rounds it
], ids=["zeros", "ones", "full", "full_int", "scalar_tensor", "tensor", "zeros_like",
        "new_full", "full_overflow"])
def test_creation(make):
    assert_same(make(TPU), make("cpu"))


def test_empty_and_random_creation():
    for t in (torch.empty(3, 2, dtype=C32, device=TPU),
              torch.empty_strided((2, 3), (1, 2), dtype=C32, device=TPU),
              torch.empty_like(torch.ones(4, dtype=C32, device=TPU))):
        assert t.dtype == C32 and t.device.type == "tpu"
    torch.manual_seed(0)
    r = torch.rand(20000, dtype=C32, device=TPU).cpu()
    assert r.dtype == C32
    p = torch.view_as_real(r).float()
    assert 0 <= p.min() and p.max() <= 1 and abs(p.mean() - 0.5) < 0.02
    n = torch.view_as_real(torch.randn(20000, dtype=C32, device=TPU).cpu()).float()
    # CPU's complex normal: each part N(0, 1/2), so that E|z|^2 = 1
    assert abs(n.mean()) < 0.02 and abs(n.var() - 0.5) < 0.03


# ---- copies and conversions --------------------------------------------------------------

@pytest.mark.parametrize("shape", [(), (0,), (5,), (3, 4)])
def test_host_round_trip(shape):
    x = sample(*shape) if shape != () else torch.tensor(1.5 - 0.25j, dtype=C32)
    y = x.to(TPU)
    assert y.dtype == C32 and y.shape == x.shape
    assert_same(y, x)
    assert_same(y.clone(), x)


def test_host_copies_of_views():
    x = sample(4, 6)
    y = x.to(TPU)
    for v, w in ((y.t(), x.t()), (y[1:3, ::2], x[1:3, ::2]), (y[2], x[2]),
                 (y.as_strided((3, 2), (5, 1), 2), x.as_strided((3, 2), (5, 1), 2))):
        assert_same(v, w)
        assert_same(v.contiguous(), w.contiguous())
    # a host source into a view of a tpu tensor
    z = torch.zeros(4, 6, dtype=C32)
    zt = z.to(TPU)
    src = sample(3, 2, seed=1)
    z[1:, ::3] = src
    zt[1:, ::3] = src
    assert_same(zt, z)


@pytest.mark.parametrize("dt", EVERY, ids=str)
def test_conversions_from_complex32(dt):
    x = sample(3, 4)
    if not (dt.is_floating_point or dt.is_complex):
        # NaN and negative values into integers are undefined on CPU (and differ from tpu's
        # conversions of float16 alike): finite values, nonnegative for the unsigned
        x = torch.where(torch.isnan(x), torch.zeros_like(x), x)
        if dt in (torch.uint8, torch.bool):
            x = torch.view_as_complex(torch.view_as_real(x).abs())
    like_cpu(lambda t: t.to(dt), x)
    like_cpu(lambda t: t.t().to(dt), x)


@pytest.mark.parametrize("dt", EVERY, ids=str)
def test_conversions_to_complex32(dt):
    if dt.is_complex:
        x = sample(3, 4).to(dt)
    elif dt.is_floating_point:
        x = (torch.arange(12.0).reshape(3, 4) - 5.5).to(dt)
    else:
        x = torch.arange(12).reshape(3, 4).to(dt)
    like_cpu(lambda t: t.to(C32), x)
    like_cpu(lambda t: t.t().to(C32), x)


def test_copy_between_dtypes_into_views():
    for dt in (torch.complex64, torch.float32, torch.int32, torch.float16, C32):
        src = sample(2, 3, seed=2).to(dt) if dt.is_complex else torch.arange(6).reshape(2, 3).to(dt)
        want = torch.zeros(3, 4, dtype=C32)
        got = want.to(TPU)
        want[1:, 1:].copy_(src)
        got[1:, 1:].copy_(src.to(TPU))
        assert_same(got, want)
    # complex32 into other dtypes' views
    for dt in (torch.complex64, torch.complex128, torch.float32, torch.int64):
        want = torch.zeros(3, 4, dtype=dt)
        got = want.to(TPU)
        src = sample(2, 3, seed=3)
        src[0, 0] = 2 + 1j  # no NaN into integers
        src[0, 4 % 3] = 1
        src = torch.where(torch.isnan(src), torch.zeros_like(src), src)
        want[1:, :3].copy_(src)
        got[1:, :3].copy_(src.to(TPU))
        assert_same(got, want)


def test_broadcast_copy_and_conj():
    x = sample(4)
    want = torch.zeros(3, 4, dtype=C32)
    got = want.to(TPU)
    want.copy_(x)
    got.copy_(x.to(TPU))
    assert_same(got, want)
    assert_same(x.to(TPU).conj().resolve_conj(), x.conj().resolve_conj())
    want = torch.zeros(4, dtype=C32)
    got = want.to(TPU)
    want.copy_(x.conj())
    got.copy_(x.to(TPU).conj())
    assert_same(got, want)
    assert_same(x.to(TPU).conj(), x.conj())


def test_item_and_tolist():
    x = torch.tensor([1.5 - 2j, 0.25 + 3j], dtype=C32)
    y = x.to(TPU)
    assert y[0].item() == x[0].item() == complex(1.5, -2)
    assert isinstance(y[1].item(), complex)
    assert y.tolist() == x.tolist()


# ---- views and aliasing ------------------------------------------------------------------

def test_view_as_real_is_a_view():
    x = sample(3, 2)
    y = x.to(TPU)
    r = torch.view_as_real(y)
    assert r.dtype == torch.float16 and r.shape == (3, 2, 2)
    assert r.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    assert_same(r, torch.view_as_real(x))
    r[1, 0, 1] = 5.0  # a write through the real view ...
    x2 = x.clone()
    torch.view_as_real(x2)[1, 0, 1] = 5.0
    assert_same(y, x2)  # ... is seen by the complex32 tensor
    y[0, 1] = -1 + 0.5j  # and the other way
    torch.view_as_real(x2)  # noqa: B018
    x2[0, 1] = -1 + 0.5j
    assert_same(r, torch.view_as_real(x2))
    assert_same(y.real, x2.real)
    assert_same(y.imag, x2.imag)


def test_view_as_complex_of_half():
    h = torch.arange(12, dtype=torch.float16).reshape(3, 2, 2)
    ht = h.to(TPU)
    c = torch.view_as_complex(ht)
    assert c.dtype == C32 and c.shape == (3, 2)
    assert c.untyped_storage().data_ptr() == ht.untyped_storage().data_ptr()
    assert_same(c, torch.view_as_complex(h))
    c[2, 1] = 9 - 9j
    h2 = h.clone()
    torch.view_as_complex(h2)[2, 1] = 9 - 9j
    assert_same(ht, h2)
    # CPU's checks, same exception type
    like_cpu(lambda t: torch.view_as_complex(t), torch.ones(3, 3, dtype=torch.float16))
    like_cpu(lambda t: torch.view_as_complex(t), torch.ones(3, 2, dtype=torch.float16).t())


def test_views_alias():
    x = sample(4, 6)
    y = x.to(TPU)
    views = [lambda t: t.view(6, 4), lambda t: t.reshape(24), lambda t: t.t(),
             lambda t: t.transpose(0, 1)[2:], lambda t: t.select(1, 3), lambda t: t[1:3, ::2],
             lambda t: t.as_strided((2, 3), (6, 2), 1), lambda t: t.unsqueeze(0),
             lambda t: t.narrow(0, 1, 2), lambda t: t.unfold(1, 2, 2), lambda t: t.expand(2, 4, 6),
             lambda t: t.view(torch.float32), lambda t: t.view(torch.int16),
             lambda t: t.unflatten(1, (2, 3)).flatten(0, 1)]
    for v in views:
        assert_same(v(y), v(x))
        assert v(y).untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    # writes through views reach the base
    y[1:3, ::2] = 2 - 1j
    x[1:3, ::2] = 2 - 1j
    y.t()[5].fill_(0.5j)
    x.t()[5].fill_(0.5j)
    y.select(0, 3).zero_()
    x.select(0, 3).zero_()
    assert_same(y, x)


def test_contiguous_clone_cat_stack():
    a, b = sample(3, 4), sample(3, 4, seed=5)
    like_cpu(lambda t: t.t().contiguous(), a)
    like_cpu(lambda t: t[:, 1::2].clone(), a)
    like_cpu(lambda s, t: torch.cat([s, t]), a, b)
    like_cpu(lambda s, t: torch.cat([s, t.t().t()], dim=-1), a, b)
    like_cpu(lambda s, t: torch.stack([s, t], 1), a, b)
    # cat of complex32 with another dtype promotes as CPU does
    like_cpu(lambda s, t: torch.cat([s, t]), a, b.to(torch.complex64))
    like_cpu(lambda s, t: torch.cat([s, t]), a, torch.ones(3, 4, dtype=torch.float16))
    # out= of complex32
    want = torch.empty(0, dtype=C32)
    got = want.to(TPU)
    torch.cat([a, b], out=want)
    torch.cat([a.to(TPU), b.to(TPU)], out=got)
    assert_same(got, want)


# ---- fill_ -------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [0, 3, -1.25, 2 - 3j, 1e6, float("nan"), True])
def test_fill(value):
    def f(t):
        u = t.clone()
        u.fill_(value)
        u[1:, ::2].fill_(-value if not isinstance(value, bool) else 0)
        return u
    like_cpu(f, sample(3, 4))


def test_fill_tensor_value():
    like_cpu(lambda t, v: t.clone().fill_(v), sample(3), torch.tensor(1 + 2j, dtype=C32))
    like_cpu(lambda t, v: t.clone().fill_(v), sample(3), torch.tensor(2.5))
    x = sample(3).to(TPU)
    x.fill_(torch.tensor(1 - 1j, dtype=C32, device=TPU))  # a tpu 0-d value
    assert_same(x, torch.full((3,), 1 - 1j, dtype=C32))
    like_cpu(lambda t, v: t.clone().fill_(v), sample(3), torch.ones(2, dtype=C32))


# ---- ops CPU computes on complex32 -------------------------------------------------------

# rounding: CPU computes complex32 products in half arithmetic (each product and sum rounded),
# tpu in complex64 rounded once at the end (CUDA's way): one or two units of the last place
MUL_TOL = dict(atol=1e-2, rtol=2e-3)


@pytest.mark.parametrize("f,tol", [
    (lambda a, b: a + b, {}),
    (lambda a, b: a - b, {}),
    (lambda a, b: torch.add(a, b, alpha=2), {}),
    (lambda a, b: torch.sub(a, b, alpha=0.5), MUL_TOL),
    (lambda a, b: a * b, MUL_TOL),
    (lambda a, b: a + 1.5, {}),
    (lambda a, b: a * (2 - 1j), MUL_TOL),
    (lambda a, b: 1 - a, {}),
    (lambda a, b: a == b, {}),
    (lambda a, b: a != b, {}),
    (lambda a, b: a == a, {}),
    (lambda a, b: a == (1 - 2j), {}),
    (lambda a, b: -a, {}),
    (lambda a, b: a.abs(), MUL_TOL),
    (lambda a, b: a.sgn(), MUL_TOL),
    (lambda a, b: a.conj_physical(), {}),
    (lambda a, b: a.isnan(), {}),
    (lambda a, b: a.isfinite(), {}),
    (lambda a, b: torch.addcmul(a, a, b), dict(atol=2e-2, rtol=4e-3)),
    (lambda a, b: torch.where(a.real > 0, a, b), {}),
    (lambda a, b: a.index_select(1, torch.tensor([2, 0], device=a.device)), {}),
    (lambda a, b: a[torch.tensor([1, 0, 1], device=a.device)], {}),
    (lambda a, b: a.masked_select(a.real > 0), {}),
    (lambda a, b: a.nonzero(), {}),
    (lambda a, b: a.roll(1, 1), {}),
    (lambda a, b: a.repeat(2, 1), {}),
    (lambda a, b: torch.nn.functional.pad(a, (1, 2)), {}),
    (lambda a, b: a.tril(), {}),
    (lambda a, b: a.triu(1), {}),
    (lambda a, b: a.masked_fill(a.real > 0, 2j), {}),
    (lambda a, b: a.index_fill(1, torch.tensor([1], device=a.device), -1), {}),
    (lambda a, b: torch.outer(a[0], b[1]), MUL_TOL),
    (lambda a, b: a.any(), {}),
    (lambda a, b: a.all(), {}),
    (lambda a, b: torch.count_nonzero(a), {}),
    (lambda a, b: a.diag_embed(), {}),
    (lambda a, b: torch.select_scatter(a, b[0], 0, 1), {}),
    (lambda a, b: torch.slice_scatter(a, b[:, :2], 1, 0, 2), {}),
    (lambda a, b: a.narrow_copy(1, 1, 2), {}),
    (lambda a, b: a.repeat_interleave(2, 0), {}),
    (lambda a, b: torch.isclose(a, b), {}),
    (lambda a, b: a + b.to(torch.complex64), {}),  # promotes to complex64, as on CPU
    (lambda a, b: a + torch.ones(4, dtype=torch.float16, device=a.device), {}),
    (lambda a, b: a * torch.ones(4, device=a.device), MUL_TOL),  # complex64
], ids=lambda v: "" if isinstance(v, dict) else None)
def test_ops_like_cpu(f, tol):
    a, b = sample(3, 4), sample(3, 4, seed=7)
    like_cpu(f, a, b, **tol)


def test_reductions_cpu_has():
    a = torch.where(torch.isnan(sample(3, 4)), torch.zeros(3, 4, dtype=C32), sample(3, 4))
    like_cpu(lambda t: torch.linalg.vector_norm(t), a, atol=2e-2, rtol=4e-3)
    like_cpu(lambda t: t.var(1), a, atol=2e-2, rtol=4e-3)
    like_cpu(lambda t: t.std(), a, atol=2e-2, rtol=4e-3)


def test_in_place_and_out_on_views():
    a, b = sample(3, 4), sample(3, 4, seed=9)
    for op in (lambda s, t: s.add_(t), lambda s, t: s.mul_(t), lambda s, t: s.sub_(t, alpha=2),
               lambda s, t: s.neg_(), lambda s, t: s.conj_physical_(),
               lambda s, t: s.masked_fill_(t.real > 0, 1 + 1j),
               lambda s, t: s.index_put_((torch.tensor([0, 2], device=s.device),), t[0]),
               lambda s, t: s.index_add_(1, torch.tensor([2], device=s.device), t[:, :1]),
               lambda s, t: s.index_copy_(1, torch.tensor([0], device=s.device), t[:, 1:2])):
        want_base = a.clone()
        got_base = a.to(TPU)
        op(want_base[:, 1:].t(), b[:, 1:].t())  # a view: the base sees the write
        op(got_base[:, 1:].t(), b[:, 1:].t().to(TPU))
        assert_same(got_base, want_base, **MUL_TOL)
    want = torch.empty(0, dtype=C32)
    got = want.to(TPU)
    torch.add(a, b, out=want)
    torch.add(a.to(TPU), b.to(TPU), out=got)
    assert_same(got, want)
    like_cpu(lambda s, t: torch.mul(s, t, out=torch.empty(3, 4, dtype=torch.complex64,
                                                          device=s.device)), a, b, **MUL_TOL)


def test_mul_by_cpu_scalar_tensor():
    # upstream test_mul_chalf_tensor_and_cpu_scalar (CUDA only there)
    x = sample(2, 2).to(TPU)
    assert_same(x * 2.5, (x * torch.tensor(2.5, dtype=C32)).cpu())


def test_complex_from_half_parts():
    re, im = torch.randn(3, 4).half(), torch.randn(4).half()
    like_cpu(lambda r, i: torch.complex(r, i), re, im)
    like_cpu(lambda r, i: torch.complex(r, i.float()), re, im)  # CPU's dtype error
    out = torch.empty(0, dtype=C32)
    got = out.to(TPU)
    torch.complex(re, im, out=out)
    torch.complex(re.to(TPU), im.to(TPU), out=got)
    assert_same(got, out)


# ---- refusals: CPU's error types ---------------------------------------------------------

@pytest.mark.parametrize("f", [
    lambda a: a / a, lambda a: a.sum(), lambda a: a.mean(), lambda a: a.exp(),
    lambda a: a.flip(-1), lambda a: a @ a.t(), lambda a: a.cumsum(0), lambda a: a < a,
    lambda a: a.sort(), lambda a: a.topk(1), lambda a: torch.maximum(a, a), lambda a: a.clamp(0, 1),
    lambda a: a.sign(), lambda a: a.argmax(), lambda a: a.pow(2), lambda a: torch.equal(a, a),
    lambda a: a.gather(0, torch.zeros(1, 4, dtype=torch.long, device=a.device)),
    lambda a: a.unique(), lambda a: a.prod(), lambda a: a.reciprocal(),
    lambda a: torch.arange(3, dtype=C32, device=a.device),
    lambda a: torch.eye(3, dtype=C32, device=a.device),
    lambda a: a.clone().random_(), lambda a: a.logical_not(),
], ids=["div", "sum", "mean", "exp", "flip", "matmul", "cumsum", "lt", "sort", "topk", "maximum",
        "clamp", "sign", "argmax", "pow", "equal", "gather", "unique", "prod", "reciprocal",
        "arange", "eye", "random_", "logical_not"])
def test_refusals_like_cpu(f):
    like_cpu(f, sample(3, 4))


# ops that tpu decomposes into ops it has (torch_pjrt/_decompositions.py), while CPU has no
# complex32 kernel for them: CPU's refusal, not the decomposition's values
@pytest.mark.parametrize("f", [
    lambda a: torch.nn.functional.channel_shuffle(a.reshape(1, 4, 3, 1), 2),
    lambda a: torch.nn.functional.glu(a), lambda a: torch.logaddexp(a, a),
    lambda a: torch.isin(a, a[0]), lambda a: torch.nn.functional.hardshrink(a),
    lambda a: a.sinc(), lambda a: torch.linalg.cross(a[:, :3], a[:, 1:]),
    lambda a: torch.nn.functional.unfold(a.reshape(1, 1, 3, 4), 2),
], ids=["channel_shuffle", "glu", "logaddexp", "isin", "hardshrink", "sinc", "cross", "im2col"])
def test_decomposed_refusals_like_cpu(f):
    like_cpu(f, sample(3, 4))


def test_decomposed_op_cpu_has():
    like_cpu(lambda a: torch.ops.aten.unfold_backward(a.reshape(3, 2, 2), [3, 4], 1, 2, 2),
             sample(3, 4))


def test_no_fallback_for_supported_ops(fallbacks):
    """The supported ops run on tpu, not through CPU's kernel."""
    a, b = sample(3, 4).to(TPU), sample(3, 4, seed=3).to(TPU)
    idx = torch.tensor([2, 0], device=TPU)
    for r in (a + b, a * b, a - 1j, a == b, a != b, a.abs(), -a, torch.cat([a, b]),
              torch.stack([a, b]), a.to(torch.complex64).to(C32), a.to(torch.float32),
              torch.ones(3, device=TPU).to(C32), a.clone().fill_(1j), a.clone().zero_(),
              torch.view_as_real(a) * 2, a.index_select(0, idx), a[idx], a.t().contiguous(),
              torch.where(a.real > 0, a, b), torch.zeros(2, dtype=C32, device=TPU),
              torch.full((2,), 1j, dtype=C32, device=TPU), a.conj().resolve_conj()):
        r.cpu()
    assert a[0, 0].item() == 1 - 2j
    fallbacks.assert_none()


# ---- eager modes and devices -------------------------------------------------------------

@pytest.mark.parametrize("mode", ["strict", "debug", "defer_and_fuse"])
def test_eager_modes(mode):
    from torch_pjrt.modes import eager_mode

    def work(dev):
        a = torch.view_as_complex(torch.arange(24, dtype=torch.float16).reshape(3, 4, 2) / 7)
        a = a.to(dev)
        b = torch.full((3, 4), 1 - 2j, dtype=C32, device=dev)
        c = a * b + a
        c[1:, ::2] = 3j
        torch.view_as_real(c)[0, 0, 1] = 9
        return c, torch.cat([c, a.t().t()]).to(torch.complex64), a == b, a[1, 2].item()

    want = work("cpu")
    with eager_mode(mode):
        got = work(TPU)
        got = [g.cpu() if isinstance(g, torch.Tensor) else g for g in got]
    for g, w in zip(got[:3], want[:3]):
        assert_same(g.to(TPU), w, **MUL_TOL)
    assert got[3] == want[3]


def test_across_devices():
    from conftest import run_python

    code = """
import warnings, torch, torch_pjrt
warnings.simplefilter("ignore")
R = lambda t: torch.view_as_real(t) if t.dtype == torch.complex32 else t
x = torch.view_as_complex(torch.arange(12, dtype=torch.float16).reshape(3, 2, 2))
a = x.to("tpu:0")
for dst in (torch.complex32, torch.complex64, torch.float32):
    b = a.to("tpu:1", dtype=dst)
    assert b.device.index == 1 and b.dtype == dst, (b.device, b.dtype)
    assert torch.equal(R(b.cpu()), R(x.to(dst))), dst
c = torch.zeros(3, 4, dtype=torch.complex32, device="tpu:1")
c[:, 1:3] = a  # into a view, from another device
w = torch.zeros(3, 4, dtype=torch.complex32)
w[:, 1:3] = x
assert torch.equal(R(c.cpu()), R(w))
c64 = a.to(torch.complex64).to("tpu:1", dtype=torch.complex32)
assert torch.equal(R(c64.cpu()), R(x))
print("ok")
"""
    r = run_python(code, TORCH_PJRT_CPU_DEVICE_COUNT="2")
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == "ok", r.stderr[-3000:]
