"""Complex numbers and FFTs on tpu against CPU: lazy conjugation/negation (conj, H, mH,
resolve_*), view_as_real / view_as_complex as aliasing views, complex/polar/angle/lerp, the
torch.fft primitives, and complex reductions."""
import pytest
import torch

TPU = torch.device("tpu")


def _z(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=torch.complex64, generator=g)


def _x(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def _same(got, want, **kw):
    assert got.device.type == "tpu"
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, **kw)


# ---- lazy conjugation and negation (these used to recurse until the stack overflowed) ----

LAZY = {
    "conj": lambda t: t.conj(),
    "H": lambda t: t.H,
    "mH": lambda t: t.mH,
    "adjoint": lambda t: t.adjoint(),
    "resolve_conj": lambda t: t.conj().resolve_conj(),
    "conj_physical": torch.conj_physical,
    "imag_of_conj": lambda t: t.conj().imag,
    "resolve_neg": lambda t: t.conj().imag.resolve_neg(),
    "mul_conj": lambda t: t.conj() * t,
    "matmul_mH": lambda t: t @ t.mH,
    "conj_twice": lambda t: t.conj().conj() + 1,
    "clone_of_conj": lambda t: t.conj().clone(),
}


@pytest.mark.parametrize("name", sorted(LAZY))
def test_lazy_conj_and_neg_match_cpu(name):
    z = _z(3, 3)
    _same(LAZY[name](z.to(TPU)), LAZY[name](z))


def test_copy_between_conj_and_plain_tensors():
    z = _z(4, 5)
    for conj_dst in (False, True):
        for conj_src in (False, True):
            want, got = torch.zeros_like(z), torch.zeros_like(z).to(TPU)
            (want.conj() if conj_dst else want).copy_(z.conj() if conj_src else z)
            (got.conj() if conj_dst else got).copy_((z.to(TPU).conj() if conj_src else z.to(TPU)))
            _same(got, want)
    t = z.to(TPU)
    t.copy_(t.conj())  # same storage
    _same(t, z.conj().resolve_conj())
    _same(z.conj().to(TPU), z.conj())
    torch.testing.assert_close(z.to(TPU).conj().cpu(), z.conj())


def test_inplace_op_through_a_conj_view():
    z = _z(3, 4)
    t = z.to(TPU)
    t.conj().mul_(2j)
    z.conj().mul_(2j)
    _same(t, z)


# ---- view_as_real / view_as_complex: views sharing the storage ----


def test_view_as_real_aliases_its_base():
    z = _z(3, 4)
    t = z.to(TPU)
    r = torch.view_as_real(t)
    assert r.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    _same(r, torch.view_as_real(z))
    r[1, 2, 0] = 7.0  # writes through the view reach the complex base
    r[..., 1].mul_(-1)
    zr = torch.view_as_real(z)
    zr[1, 2, 0] = 7.0
    zr[..., 1].mul_(-1)
    _same(t, z)
    _same(torch.view_as_real(t[:, 1:3].transpose(0, 1)), torch.view_as_real(z[:, 1:3].transpose(0, 1)))


def test_view_as_complex_aliases_its_base():
    x = _x(4, 3, 2)
    t = x.to(TPU)
    c = torch.view_as_complex(t)
    assert c.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    _same(c, torch.view_as_complex(x))
    c.add_(1 + 2j)
    torch.view_as_complex(x).add_(1 + 2j)
    _same(t, x)
    _same(torch.view_as_complex(t[1:]), torch.view_as_complex(x[1:]))
    _same(torch.view_as_real(torch.view_as_complex(t)), x)


@pytest.mark.parametrize("bad", [
    lambda x: torch.view_as_complex(x[..., :1]),
    lambda x: torch.view_as_complex(x.transpose(0, 2)),
    lambda x: torch.view_as_real(x.to(torch.complex64).conj()),
])
def test_view_errors_like_cpu(bad):
    x = _x(4, 3, 2)
    with pytest.raises(RuntimeError) as cpu_err:
        bad(x)
    with pytest.raises(type(cpu_err.value)):
        bad(x.to(TPU))


def test_real_imag_of_complex():
    z = _z(5, 2)
    t = z.to(TPU)
    _same(t.real, z.real)
    _same(t.imag, z.imag)
    t.imag.zero_()
    z.imag.zero_()
    _same(t, z)


# ---- complex construction and elementwise ----


def test_complex_and_polar():
    a, b = _x(4, 5, seed=1), _x(4, 5, seed=2)
    _same(torch.complex(a.to(TPU), b.to(TPU)), torch.complex(a, b))
    _same(torch.polar(a.abs().to(TPU), b.to(TPU)), torch.polar(a.abs(), b))
    ad, bd = a.double(), b.double()
    _same(torch.complex(ad.to(TPU), bd.to(TPU)), torch.complex(ad, bd))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.complex64])
def test_angle(dtype):
    x = torch.tensor([-2.0, 0.0, 3.0, -0.5, float("nan")]) if dtype != torch.int64 else torch.tensor([-2, 0, 3])
    if dtype == torch.complex64:
        x = _z(7)
    x = x.to(dtype)
    _same(torch.angle(x.to(TPU)), torch.angle(x), equal_nan=True)


def test_lerp_complex():
    a, b, w = _z(6, seed=1), _z(6, seed=2), _z(6, seed=3)
    _same(torch.lerp(a.to(TPU), b.to(TPU), w.to(TPU)), torch.lerp(a, b, w))
    _same(torch.lerp(a.to(TPU), b.to(TPU), 0.7), torch.lerp(a, b, 0.7))


# ---- FFT ----

NORMS = [None, "ortho", "forward"]

FFTS = {
    "fft": (torch.fft.fft, "c"),
    "ifft": (torch.fft.ifft, "c"),
    "fft_of_real": (torch.fft.fft, "r"),
    "fft_n": (lambda t, norm: torch.fft.fft(t, n=9, norm=norm), "c"),
    "fft2_dims": (lambda t, norm: torch.fft.fft2(t, dim=(0, 2), norm=norm), "c"),
    "fftn": (torch.fft.fftn, "c"),
    "ifftn": (torch.fft.ifftn, "c"),
    "fftn_4d": (lambda t, norm: torch.fft.fftn(t.reshape(2, 2, 6, 5), norm=norm), "c"),
    "rfft": (torch.fft.rfft, "r"),
    "rfft2_reversed_dims": (lambda t, norm: torch.fft.rfft2(t, dim=(2, 0), norm=norm), "r"),
    "rfftn_4d": (lambda t, norm: torch.fft.rfftn(t.reshape(2, 2, 6, 5), norm=norm), "r"),
    "irfft": (torch.fft.irfft, "c"),
    "irfft_n": (lambda t, norm: torch.fft.irfft(t, n=7, norm=norm), "c"),
    "irfftn": (torch.fft.irfftn, "c"),
    "hfft": (torch.fft.hfft, "c"),
    "ihfft": (torch.fft.ihfft, "r"),
    "hfft2": (torch.fft.hfft2, "c"),
    "ihfftn": (torch.fft.ihfftn, "r"),
}


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("name", sorted(FFTS))
def test_fft_matches_cpu(name, norm):
    fn, kind = FFTS[name]
    x = _z(4, 6, 5) if kind == "c" else _x(4, 6, 5)
    _same(fn(x.to(TPU), norm=norm), fn(x, norm=norm), atol=1e-4, rtol=1e-4)


def test_fft_runs_on_device_and_stft():
    before = dict(torch.tpu.fallback_ops())
    x = _x(2, 64)
    got = torch.stft(x.to(TPU), 16, window=torch.hann_window(16).to(TPU), return_complex=True)
    _same(got, torch.stft(x, 16, window=torch.hann_window(16), return_complex=True), atol=1e-4, rtol=1e-4)
    z = _z(8)
    _same(torch.fft.fftshift(torch.fft.fft(z.to(TPU))), torch.fft.fftshift(torch.fft.fft(z)), atol=1e-5, rtol=1e-5)
    assert dict(torch.tpu.fallback_ops()) == before


# ---- complex reductions and scans ----

REDUCTIONS = {
    "sum_dim": lambda a: a.sum(1),
    "sum": lambda a: a.sum(),
    "mean": lambda a: a.mean(0),
    "prod_dim": lambda a: a.prod(1),
    "prod": lambda a: a.prod(),
    "vector_norm": lambda a: torch.linalg.vector_norm(a),
    "vector_norm_3": lambda a: torch.linalg.vector_norm(a, 3, dim=1),
    "vector_norm_inf": lambda a: torch.linalg.vector_norm(a, float("inf")),
    "vector_norm_dtype": lambda a: torch.linalg.vector_norm(a, dtype=torch.complex128),
    "norm": lambda a: torch.norm(a),
    "var": lambda a: torch.var(a, 1),
    "std": lambda a: torch.std(a),
    "var_mean_mean": lambda a: torch.var_mean(a, 0)[1],
    "var_mean_var": lambda a: torch.var_mean(a, 0)[0],
    "cumsum": lambda a: a.cumsum(1),
    "cumprod": lambda a: a.cumprod(0),
    "logsumexp": lambda a: torch.logsumexp(a, 1),
    "trace": lambda a: a[:4, :4].trace(),
    "einsum": lambda a: torch.einsum("ij,ij->i", a, a),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_complex_reduction_matches_cpu(name):
    z = _z(4, 5)
    _same(REDUCTIONS[name](z.to(TPU)), REDUCTIONS[name](z), atol=1e-4, rtol=1e-4)


def test_nansum_of_complex_raises_like_cpu():
    z = _z(3)
    with pytest.raises(RuntimeError):
        torch.nansum(z)
    with pytest.raises(RuntimeError, match="complex"):
        torch.nansum(z.to(TPU)).cpu()  # (defer_and_fuse reports it when the result is read)


def test_sgn_backward_zero_gradient_stays_on_device():
    before = dict(torch.tpu.fallback_ops())
    x = _x(5).to(TPU).requires_grad_()
    torch.sgn(x).sum().backward()  # real sgn's gradient is autograd's _efficientzerotensor
    _same(x.grad, torch.zeros(5))
    z = _z(5)
    a, b = z.clone().requires_grad_(), z.to(TPU).requires_grad_()
    torch.view_as_real(torch.sgn(a)).sum().backward()
    torch.view_as_real(torch.sgn(b)).sum().backward()
    _same(b.grad, a.grad)
    assert dict(torch.tpu.fallback_ops()) == before
