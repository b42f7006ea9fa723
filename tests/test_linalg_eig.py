"""torch.linalg.eig / eigvals of general square matrices (csrc/ops/linalg_eig.c) against
PyTorch on the CPU, with no CPU fallback.

The eigenvalue order is not part of the contract (LAPACK's follows its deflation order), so
eigenvalues are compared as sets: each CPU eigenvalue is matched with the nearest unused one of
ours. Eigenvectors are defined up to a phase per vector (and, for a repeated eigenvalue, only
as a subspace), so they are checked by the residual ||A v - lambda v||, unit 2-norm and the
convention that the component of largest modulus is real; where an eigenvalue is simple they
must equal CPU's vector times a phase."""
from __future__ import annotations

import pytest
import torch

TPU = torch.device("tpu")
DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)


def single(dt):
    return dt in (torch.float32, torch.complex64)


def tol(dt):
    return 2e-4 if single(dt) else 1e-10


def complex_of(dt):
    return {torch.float32: torch.complex64, torch.float64: torch.complex128}.get(dt, dt)


def gen(dt, *shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dt)


def flat(x, keep):
    return x.reshape(-1, *x.shape[x.dim() - keep:])


def match(w, wc):
    """For each matrix, indices p with w[p[i]] the eigenvalue of ours matched to wc[i]
    (nearest unused one, in CPU's order)."""
    perms = []
    for wb, wcb in zip(flat(w, 1), flat(wc, 1)):
        free = list(range(wb.numel()))
        p = []
        for z in wcb:
            j = min(free, key=lambda k: abs(complex(wb[k]) - complex(z)))
            free.remove(j)
            p.append(j)
        perms.append(p)
    return perms


def scale(a):
    """A magnitude to make tolerances relative: max |a| (1 for a zero or empty matrix)."""
    m = a.abs().max().item() if a.numel() else 0.0
    return m if m > 0 else 1.0


def check_values(w, wc, a):
    assert w.dtype == wc.dtype and w.shape == wc.shape
    t = tol(a.dtype) * scale(a) * max(a.shape[-1], 1)
    for p, wb, wcb in zip(match(w, wc), flat(w, 1), flat(wc, 1)):
        torch.testing.assert_close(wb[p], wcb, rtol=0, atol=t)


def check_vectors(a, w, v):
    """Residual, unit norm, largest component real and >= 0."""
    n = a.shape[-1]
    ac = a.to(v.dtype)
    t = tol(a.dtype) * scale(a) * max(n, 1)
    res = ac @ v - v * w.unsqueeze(-2)
    assert res.abs().max().item() <= t, f"residual {res.abs().max().item()}"
    norms = torch.linalg.vector_norm(v, dim=-2)
    torch.testing.assert_close(norms, torch.ones_like(norms), rtol=0, atol=tol(a.dtype) * 10)
    # among the components of (nearly, up to rounding) largest modulus, one is real and > 0
    vf = flat(v, 2)
    mag = vf.abs()
    near = mag >= mag.amax(dim=-2, keepdim=True) * (1 - 1e-3)
    real_pos = (vf.imag == 0) & (vf.real > 0)
    assert (near & real_pos).any(dim=-2).all(), "largest component not real and positive"


def check_like_cpu_vectors(w, v, wc, vc, dt, gap):
    """Ours equals CPU's eigenvector times a phase, for eigenvalues at least `gap` from every
    other eigenvalue of their matrix."""
    compared = 0
    for p, wcb, vb, vcb in zip(match(w, wc), flat(wc, 1), flat(v, 2), flat(vc, 2)):
        for i, j in enumerate(p):
            others = torch.cat([wcb[:i], wcb[i + 1:]])
            if others.numel() and (others - wcb[i]).abs().min().item() < gap:
                continue
            x, xc = vb[:, j], vcb[:, i]
            ip = (xc.conj() * x).sum()
            torch.testing.assert_close(x, xc * ip / ip.abs(), rtol=0, atol=tol(dt) * 50)
            compared += 1
    return compared


def run_eig(a):
    w, v = torch.linalg.eig(a.to(TPU))
    assert w.device.type == "tpu" and v.device.type == "tpu"
    return w.cpu(), v.cpu()


def full_check(a, gap=1e-2):
    w, v = run_eig(a)
    wc, vc = torch.linalg.eig(a)
    assert v.dtype == vc.dtype == complex_of(a.dtype) and v.shape == vc.shape
    check_values(w, wc, a)
    check_vectors(a, w, v)
    return w, v, wc, vc, check_like_cpu_vectors(w, v, wc, vc, a.dtype, gap)


@pytest.mark.parametrize("dt", DTYPES)
def test_random_batched(dt, fallbacks):
    a = gen(dt, 3, 5, 5, seed=1)
    w, v, wc, vc, compared = full_check(a)
    assert compared >= 12  # random spectra are simple: (nearly) every vector is compared
    if not dt.is_complex:  # real random matrices have complex-conjugate pairs
        assert (wc.imag.abs() > 1e-3).any()
    fallbacks.assert_none()


def test_float64_larger(fallbacks):
    a = gen(torch.float64, 2, 12, 12, seed=2)
    full_check(a)
    fallbacks.assert_none()


def rotation_block():
    """A real matrix with eigenvalues +-i (a pure complex pair) and 2, 3."""
    a = torch.zeros(4, 4)
    a[0, 1], a[1, 0] = -1.0, 1.0
    a[2, 2], a[3, 3], a[2, 3] = 2.0, 3.0, 0.5
    q = torch.linalg.qr(gen(torch.float64, 4, 4, seed=3))[0].float()
    return q @ a @ q.T


def repeated_similar():
    """Q diag(1, 2, 2, -1) Q^T (symmetric, repeated eigenvalue 2)."""
    q = torch.linalg.qr(gen(torch.float64, 4, 4, seed=4))[0]
    return (q @ torch.diag(torch.tensor([1.0, 2, 2, -1], dtype=torch.float64)) @ q.T).float()


def nonnormal_repeated():
    """Non-symmetric with a repeated but non-defective eigenvalue (diagonalizable)."""
    d = torch.diag(torch.tensor([3.0, 3.0, -2.0, 0.5], dtype=torch.float64))
    s = gen(torch.float64, 4, 4, seed=5) + 4 * torch.eye(4, dtype=torch.float64)
    return (s @ d @ torch.linalg.inv(s)).float()


def cyclic():
    """Cyclic permutation: eigenvalues the 4th roots of unity (shift 0 makes no progress)."""
    return torch.roll(torch.eye(4), 1, dims=0)


STRUCTURED = {
    "complex_pair": rotation_block,
    "repeated_symmetric": repeated_similar,
    "repeated_nonnormal": nonnormal_repeated,
    "upper_triangular": lambda: torch.triu(gen(torch.float32, 4, 4, seed=6)),
    "lower_triangular": lambda: torch.tril(gen(torch.float32, 4, 4, seed=7)),
    "diagonal": lambda: torch.diag(torch.tensor([4.0, -1.0, 2.5, -1.0])),
    "symmetric": lambda: (lambda x: x + x.T)(gen(torch.float32, 4, 4, seed=8)),
    "zero": lambda: torch.zeros(4, 4),
    "identity": lambda: torch.eye(4),
    "cyclic_permutation": cyclic,
    "tiny_scale": lambda: gen(torch.float32, 4, 4, seed=9) * 1e-20,
    "large_scale": lambda: gen(torch.float32, 4, 4, seed=10) * 1e20,
}


@pytest.mark.parametrize("name", sorted(STRUCTURED))
def test_structured(name, fallbacks):
    a = STRUCTURED[name]()
    w, v, wc, vc, _ = full_check(a)
    if name == "diagonal":  # eigenvectors of a diagonal matrix are unit vectors
        assert (v.abs().max(dim=0).values == 1).all()
    if name in ("complex_pair", "cyclic_permutation"):
        assert (w.imag.abs() > 0.5).sum() == 2
    if name in ("symmetric", "repeated_symmetric", "upper_triangular", "diagonal"):
        # real spectra: eigenvalues and eigenvectors real up to rounding
        assert w.imag.abs().max().item() <= 1e-5 * scale(a)
        assert v.imag.abs().max().item() <= 1e-4
    fallbacks.assert_none()


def test_jordan_block(fallbacks):
    """Defective: one eigenvector only; the computed ones are (nearly) parallel, as on CPU."""
    a = torch.tensor([[2.0, 1, 0, 0], [0, 2, 1, 0], [0, 0, 2, 0], [0, 0, 0, -1]])
    w, v = run_eig(a)
    wc, _ = torch.linalg.eig(a)
    # a triple eigenvalue is only determined to ~eps^(1/3) by the data
    for p, wb, wcb in zip(match(w, wc), flat(w, 1), flat(wc, 1)):
        torch.testing.assert_close(wb[p], wcb, rtol=0, atol=1e-2)
    check_vectors(a, w, v)
    fallbacks.assert_none()


def test_one_by_one_and_empty(fallbacks):
    a = gen(torch.float32, 2, 1, 1, seed=11)
    w, v = run_eig(a)
    wc, vc = torch.linalg.eig(a)
    torch.testing.assert_close(w, wc)
    torch.testing.assert_close(v, vc)
    for shape in ((0, 0), (0, 3, 3)):
        e = torch.zeros(*shape, dtype=torch.float64)
        w, v = run_eig(e)
        wc, vc = torch.linalg.eig(e)
        assert w.shape == wc.shape and v.shape == vc.shape and w.dtype == wc.dtype
    fallbacks.assert_none()


@pytest.mark.parametrize("dt", (torch.float32, torch.complex128))
def test_eigvals(dt, fallbacks):
    a = gen(dt, 2, 4, 4, seed=12)
    w = torch.linalg.eigvals(a.to(TPU))
    assert w.device.type == "tpu"
    w = w.cpu()
    wc = torch.linalg.eigvals(a)
    check_values(w, wc, a)
    we, _ = torch.linalg.eig(a.to(TPU))  # the same algorithm: the same values, same order
    torch.testing.assert_close(w, we.cpu())
    fallbacks.assert_none()


def test_out_variants(fallbacks):
    a = gen(torch.float32, 4, 4, seed=12)
    wc, _ = torch.linalg.eig(a)
    w = torch.empty(4, dtype=torch.complex64, device=TPU)
    v = torch.empty(4, 4, dtype=torch.complex64, device=TPU)
    r = torch.linalg.eig(a.to(TPU), out=(w, v))
    assert r[0] is w and r[1] is v
    check_values(w.cpu(), wc, a)
    check_vectors(a, w.cpu(), v.cpu())
    e = torch.empty(4, dtype=torch.complex64, device=TPU)
    assert torch.linalg.eigvals(a.to(TPU), out=e) is e
    check_values(e.cpu(), wc, a)
    fallbacks.assert_none()


@pytest.mark.parametrize("dt", (torch.float32, torch.float64, torch.complex64))
def test_backward_gauge_invariant(dt, fallbacks):
    """linalg_eig_backward is built from other ops: it must run on the device and give CPU's
    gradient for a loss that does not depend on the vectors' phases nor on the order."""
    a = gen(dt, 2, 4, 4, seed=13)

    def grad(x):
        x = x.clone().requires_grad_(True)
        w, v = torch.linalg.eig(x)
        loss = (w.abs() ** 2).sum() + (v.abs() ** 4).sum()
        loss.backward()
        return x.grad

    g = grad(a.to(TPU))
    assert g.device.type == "tpu" and g.dtype == dt
    gc = grad(a)
    t = 1e-3 if single(dt) else 1e-8
    torch.testing.assert_close(g.cpu(), gc, rtol=t, atol=t)
    fallbacks.assert_none()


def test_eager_modes(mode, fallbacks):
    a = gen(torch.float32, 4, 4, seed=14)
    w, v = torch.linalg.eig(a.to(TPU) * 2)  # under defer_and_fuse, fused with the product
    w, v = w.cpu(), v.cpu()
    wc, _ = torch.linalg.eig(a * 2)
    check_values(w, wc, a * 2)
    check_vectors(a * 2, w, v)
    fallbacks.assert_none()


@pytest.mark.parametrize("fn", (torch.linalg.eig, torch.linalg.eigvals))
def test_non_square_raises_like_cpu(fn):
    a = torch.zeros(2, 3, 4)
    with pytest.raises(RuntimeError) as cpu:
        fn(a)
    with pytest.raises(RuntimeError) as dev:
        fn(a.to(TPU))
    assert str(dev.value).split("\n")[0] == str(cpu.value).split("\n")[0]
