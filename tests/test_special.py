"""Special functions and elementwise fixes (csrc/ops/special.c, csrc/ops/elementwise.c,
torch_pjrt/_decompositions.py): values against PyTorch on the CPU, no CPU fallback."""
import pytest
import torch

import torch_pjrt  # noqa: F401

S = torch.special
F = (torch.float32, torch.float64)


@pytest.fixture(autouse=True)
def no_fallback():
    before = dict(torch.tpu.fallback_ops())
    yield
    after = dict(torch.tpu.fallback_ops())
    moved = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    assert not moved, f"cpu fallback: {moved}"


def check(f, *args, rtol=None, atol=None, **kw):
    expect = f(*args, **kw)
    got = f(*[a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args], **kw)
    if isinstance(expect, tuple):
        for g, e in zip(got, expect):
            torch.testing.assert_close(g.cpu(), e, equal_nan=True, rtol=rtol, atol=atol)
    else:
        torch.testing.assert_close(got.cpu(), expect, equal_nan=True, rtol=rtol, atol=atol)


def values(dt, scale=9.0, n=200, positive=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * scale
    if positive:
        x = x.abs()
    return x.to(dt)


@pytest.mark.parametrize("n", [1, 63, 64, 400, 5000])
@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.bfloat16])
def test_atan_any_size(n, dt):
    x = values(dt, n=n)
    x[0] = float("inf")
    check(torch.atan, x)


@pytest.mark.parametrize("decimals", [-3, -1, 1, 3])
@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.bfloat16])
def test_round_decimals(decimals, dt):
    check(lambda t: torch.round(t, decimals=decimals), values(dt, scale=1000.0))


# Ranges stay where torch's own CPU kernels are accurate to the comparison tolerance.
BESSEL = [
    (torch.i0, dict(scale=9.0)),
    (S.i0e, dict(scale=30.0)),
    (S.i1, dict(scale=9.0)),
    (S.i1e, dict(scale=30.0)),
    (S.modified_bessel_i0, dict(scale=9.0)),
    (S.modified_bessel_i1, dict(scale=9.0)),
    (S.modified_bessel_k0, dict(scale=9.0, positive=True)),
    (S.modified_bessel_k1, dict(scale=9.0, positive=True)),
    (S.scaled_modified_bessel_k0, dict(scale=40.0, positive=True)),
    (S.scaled_modified_bessel_k1, dict(scale=40.0, positive=True)),
    (S.bessel_j0, dict(scale=1.2)),
    (S.bessel_j1, dict(scale=1.2)),
    (S.bessel_y0, dict(scale=1.2, positive=True)),
    (S.bessel_y1, dict(scale=1.2, positive=True)),
    (S.spherical_bessel_j0, dict(scale=9.0)),
    (S.erfcx, dict(scale=1.0)),
    (S.log_ndtr, dict(scale=9.0)),
]


@pytest.mark.parametrize("f,kw", BESSEL, ids=[f.__name__ for f, _ in BESSEL])
@pytest.mark.parametrize("dt", F)
def test_unary_special(f, kw, dt):
    check(f, values(dt, **kw))


@pytest.mark.parametrize("dt", F)
def test_bessel_large_arguments_match_asymptotics(dt):
    # beyond |x| = 20 the lowerings switch to asymptotic expansions
    x = torch.linspace(20.5, 60, 50, dtype=dt)
    for f in (S.i0e, S.i1e, S.scaled_modified_bessel_k0, S.scaled_modified_bessel_k1):
        check(f, x)


def test_ndtri():
    check(S.ndtri, torch.rand(100, dtype=torch.float64) * 0.98 + 0.01)


POLYS = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
         "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t",
         "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
         "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
         "laguerre_polynomial_l", "legendre_polynomial_p"]


@pytest.mark.parametrize("name", POLYS)
def test_orthogonal_polynomials(name):
    g = torch.Generator().manual_seed(1)
    x = torch.rand(40, generator=g, dtype=torch.float64) * 2 - 1
    if "shifted" in name:
        x = (x + 1) / 2
    x[0] = 1.0
    n = torch.randint(-2, 12, (40,), generator=g).double()
    f = getattr(S, name)
    # float32 with a tensor n; ours runs the recurrence in float64, torch's float32 one carries
    # its own rounding. float64 with a Scalar n.
    check(f, x.float(), n.float(), rtol=1e-5, atol=1e-5)
    check(f, x, 5)


@pytest.mark.parametrize("dt", [torch.int64, torch.int32])
def test_gcd_lcm(dt):
    g = torch.Generator().manual_seed(2)
    a = torch.randint(-100, 100, (60,), generator=g, dtype=dt)
    b = torch.randint(-100, 100, (60,), generator=g, dtype=dt)
    a[0], b[1], a[2], b[2] = 0, 0, 0, 0
    check(torch.gcd, a, b)
    check(torch.lcm, a, b)


@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.bfloat16])
def test_frexp(dt):
    x = values(dt, scale=1e3)
    x[:4] = torch.tensor([0.0, float("inf"), float("nan"), -3.0])
    check(torch.frexp, x)


def test_frexp_subnormals():
    check(torch.frexp, torch.tensor([1e-40, -3e-42, 1e-45, 5e-39], dtype=torch.float32))
    check(torch.frexp, torch.tensor([1e-310, -5e-324], dtype=torch.float64))


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("dt", F)
def test_polygamma(n, dt):
    x = values(dt, scale=3.0, positive=True) + 0.1
    check(lambda t: torch.polygamma(n, t), x)


@pytest.mark.parametrize("dt", F)
def test_zeta_nextafter(dt):
    x = values(dt, scale=3.0, positive=True) + 0.1
    check(S.zeta, x + 1, x)
    check(torch.nextafter, values(dt, seed=3), values(dt, seed=4))


@pytest.mark.parametrize("f", [torch.igamma, torch.igammac])
@pytest.mark.parametrize("dt", F)
def test_incomplete_gamma(f, dt):
    g = torch.Generator().manual_seed(5)
    a = (torch.rand(80, generator=g, dtype=torch.float64) * 20).to(dt)
    x = (torch.rand(80, generator=g, dtype=torch.float64) * 20).to(dt)
    a[:4] = torch.tensor([0.0, 1.0, 2.0, -1.0])
    x[:4] = torch.tensor([1.0, 0.0, float("inf"), 1.0])
    check(f, a, x)


@pytest.mark.parametrize("f", [torch.nn.functional.silu, torch.nn.functional.mish, torch.sigmoid,
                               torch.nn.functional.hardswish, torch.log2])
def test_unary_bfloat16_rounds_once(f):
    check(f, values(torch.bfloat16, scale=3.0, positive=f is torch.log2) + 0.01)


@pytest.mark.parametrize("eps", [None, 0.1])
def test_logit_backward(eps):
    x = torch.tensor([-0.5, 0.0, 0.3, 1.0, 1.5, 0.05, 0.97])
    g = torch.tensor([1.0, 2.0, 3.0, -1.0, 1.0, 0.0, 2.0])
    check(torch.ops.aten.logit_backward, g, x, eps)


def test_logit_inplace_on_integers_raises():
    with pytest.raises(RuntimeError):
        torch.arange(5).logit_()
    with pytest.raises(RuntimeError):
        torch.arange(5).to("tpu").logit_()


def test_conj_physical_inplace():
    x = torch.randn(6, dtype=torch.complex64)
    y = x.to("tpu")
    y.conj_physical_()
    torch.testing.assert_close(y.cpu(), x.conj_physical())


TRUTH = [  # (function, mpmath reference, range) over ranges where torch's CPU kernels drift
    (S.bessel_j0, lambda m, v: m.besselj(0, v), (-60.0, 60.0)),
    (S.bessel_j1, lambda m, v: m.besselj(1, v), (-60.0, 60.0)),
    (S.bessel_y0, lambda m, v: m.bessely(0, v), (0.05, 60.0)),
    (S.bessel_y1, lambda m, v: m.bessely(1, v), (0.05, 60.0)),
    (S.modified_bessel_k0, lambda m, v: m.besselk(0, v), (0.05, 60.0)),
    (S.modified_bessel_k1, lambda m, v: m.besselk(1, v), (0.05, 60.0)),
    (S.i0e, lambda m, v: m.besseli(0, v) * m.exp(-abs(v)), (-60.0, 60.0)),
    (S.i1e, lambda m, v: m.besseli(1, v) * m.exp(-abs(v)), (-60.0, 60.0)),
    (S.airy_ai, lambda m, v: m.airyai(v), (-30.0, 12.0)),
    (S.erfcx, lambda m, v: m.exp(m.mpf(v) ** 2) * m.erfc(v), (-20.0, 60.0)),
    (lambda t: torch.igamma(torch.full_like(t, 3.5), t),
     lambda m, v: m.gammainc(3.5, 0, v, regularized=True), (0.01, 40.0)),
]


@pytest.mark.parametrize("f,ref,rng", TRUTH, ids=[str(i) for i in range(len(TRUTH))])
def test_float64_against_mpmath(f, ref, rng):
    mpmath = pytest.importorskip("mpmath")
    x = torch.linspace(rng[0], rng[1], 97, dtype=torch.float64)
    got = f(x.to("tpu")).cpu()
    want = torch.tensor([float(ref(mpmath, v)) for v in x.tolist()], dtype=torch.float64)
    # relative to the function's scale near each point (zeros of oscillating functions)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
