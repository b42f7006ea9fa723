"""Matrix decompositions and solvers (csrc/ops/linalg_decomp.c) against PyTorch on the CPU:
values, shapes and dtypes, gradients through autograd, and no CPU fallback.

Outputs that LAPACK defines only up to a sign per vector (eigenvectors, singular vectors) are
compared as PyTorch's own OpInfos compare them across devices: by absolute value, plus the
reconstruction. QR uses LAPACK's reflector convention, so Q and R are compared directly."""
from __future__ import annotations

import pytest
import torch

TPU = torch.device("tpu")


def tol(dt):
    return dict(rtol=1e-4, atol=1e-4) if dt in (torch.float32, torch.complex64) else \
        dict(rtol=1e-9, atol=1e-9)


def gen(dt, *shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dt)


def wellcond(dt, *shape, seed=0):
    """Square matrices with singular values in [1, 2] (distinct), batched."""
    a = gen(torch.float64, *shape, seed=seed)
    u, _, vh = torch.linalg.svd(a)
    n = shape[-1]
    s = torch.linspace(1, 2, n, dtype=torch.float64)
    return (u * s.unsqueeze(-2)) @ vh if n else a.to(dt), None


def wc(dt, *shape, seed=0):
    return wellcond(dt, *shape, seed=seed)[0].to(dt)


def spd(dt, *shape, seed=0):
    a = gen(torch.float64, *shape, seed=seed)
    return (a @ a.mT + shape[-1] * torch.eye(shape[-1], dtype=torch.float64)).to(dt)


def sym(dt, *shape, seed=0):
    a = gen(dt, *shape, seed=seed)
    return a + a.mT


def both(fn, *args):
    exp = fn(*args)
    act = fn(*[a.to(TPU) if isinstance(a, torch.Tensor) else a for a in args])
    to_cpu = lambda x: x.cpu() if isinstance(x, torch.Tensor) else x  # noqa: E731
    if isinstance(exp, tuple):
        return tuple(map(to_cpu, act)), exp
    return to_cpu(act), exp


def check(fn, *args, dt):
    act, exp = both(fn, *args)
    torch.testing.assert_close(act, exp, **tol(dt))


@pytest.fixture(autouse=True)
def _no_fallback(fallbacks):
    yield
    fallbacks.assert_none()


CASES = {
    "lu_factor_ex": lambda dt: (torch.linalg.lu_factor_ex, gen(dt, 2, 5, 5)),
    "lu_factor_tall": lambda dt: (torch.linalg.lu_factor_ex, gen(dt, 6, 4)),
    "lu_factor_wide": lambda dt: (torch.linalg.lu_factor_ex, gen(dt, 3, 4, 6)),
    "lu": lambda dt: (torch.linalg.lu, gen(dt, 3, 6, 4)),
    "lu_unpack": lambda dt: (lambda a: torch.lu_unpack(*torch.linalg.lu_factor(a)), gen(dt, 2, 5, 5)),
    "inv": lambda dt: (torch.linalg.inv, wc(dt, 3, 5, 5)),
    "inv_ex": lambda dt: (torch.linalg.inv_ex, wc(dt, 4, 4)),
    "det": lambda dt: (torch.linalg.det, gen(dt, 3, 5, 5)),
    "det_empty": lambda dt: (torch.linalg.det, gen(dt, 2, 0, 0)),
    "slogdet": lambda dt: (torch.linalg.slogdet, gen(dt, 3, 4, 4)),
    "solve": lambda dt: (torch.linalg.solve, wc(dt, 2, 5, 5), gen(dt, 2, 5, 3, seed=1)),
    "solve_vec": lambda dt: (torch.linalg.solve, wc(dt, 5, 5), gen(dt, 5, seed=1)),
    "solve_bcast": lambda dt: (torch.linalg.solve, wc(dt, 5, 5), gen(dt, 3, 5, 2, seed=1)),
    "solve_right": lambda dt: (lambda a, b: torch.linalg.solve(a, b, left=False),
                               wc(dt, 4, 4), gen(dt, 3, 4, seed=1)),
    "lu_solve": lambda dt: (lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b),
                            wc(dt, 2, 4, 4), gen(dt, 2, 4, 3, seed=1)),
    "lu_solve_adjoint": lambda dt: (lambda a, b: torch.linalg.lu_solve(
        *torch.linalg.lu_factor(a), b, adjoint=True), wc(dt, 4, 4), gen(dt, 4, 2, seed=1)),
    "lu_solve_right": lambda dt: (lambda a, b: torch.linalg.lu_solve(
        *torch.linalg.lu_factor(a), b, left=False), wc(dt, 4, 4), gen(dt, 2, 4, seed=1)),
    "lu_solve_right_adj": lambda dt: (lambda a, b: torch.linalg.lu_solve(
        *torch.linalg.lu_factor(a), b, left=False, adjoint=True), wc(dt, 4, 4), gen(dt, 2, 4, seed=1)),
    "cholesky": lambda dt: (torch.linalg.cholesky, spd(dt, 2, 5, 5)),
    "cholesky_upper": lambda dt: (lambda a: torch.linalg.cholesky(a, upper=True), spd(dt, 4, 4)),
    "cholesky_ex": lambda dt: (torch.linalg.cholesky_ex, spd(dt, 3, 3)),
    "cholesky_legacy": lambda dt: (torch.cholesky, spd(dt, 4, 4)),
    "cholesky_inverse": lambda dt: (lambda a: torch.cholesky_inverse(torch.linalg.cholesky(a)),
                                    spd(dt, 2, 4, 4)),
    "cholesky_inverse_upper": lambda dt: (lambda a: torch.cholesky_inverse(
        torch.linalg.cholesky(a, upper=True), upper=True), spd(dt, 4, 4)),
    "cholesky_solve": lambda dt: (lambda a, b: torch.cholesky_solve(b, torch.linalg.cholesky(a)),
                                  spd(dt, 2, 4, 4), gen(dt, 2, 4, 3, seed=1)),
    "cholesky_solve_upper": lambda dt: (lambda a, b: torch.cholesky_solve(
        b, torch.linalg.cholesky(a, upper=True), upper=True), spd(dt, 4, 4), gen(dt, 4, 2, seed=1)),
    "solve_triangular": lambda dt: (lambda a, b: torch.linalg.solve_triangular(a, b, upper=True),
                                    wc(dt, 2, 4, 4) + 3 * torch.eye(4, dtype=dt), gen(dt, 2, 4, 3)),
    "solve_triangular_right_unit": lambda dt: (lambda a, b: torch.linalg.solve_triangular(
        a, b, upper=False, left=False, unitriangular=True), gen(dt, 4, 4), gen(dt, 3, 4, seed=1)),
    "triangular_solve": lambda dt: (lambda b, a: torch.triangular_solve(b, a, upper=False,
                                                                       transpose=True),
                                    gen(dt, 4, 2), gen(dt, 4, 4, seed=1) + 4 * torch.eye(4, dtype=dt)),
    "qr": lambda dt: (torch.linalg.qr, gen(dt, 3, 6, 4)),
    "qr_wide": lambda dt: (torch.linalg.qr, gen(dt, 4, 6)),
    "qr_complete": lambda dt: (lambda a: torch.linalg.qr(a, mode="complete"), gen(dt, 6, 4)),
    "qr_r": lambda dt: (lambda a: torch.linalg.qr(a, mode="r"), gen(dt, 5, 3)),
    "geqrf": lambda dt: (torch.geqrf, gen(dt, 2, 5, 3)),
    "householder_product": lambda dt: (lambda a: torch.linalg.householder_product(*torch.geqrf(a)),
                                       gen(dt, 6, 4)),
    "ormqr": lambda dt: (lambda a, c: torch.ormqr(*torch.geqrf(a), c), gen(dt, 5, 3), gen(dt, 5, 2)),
    "ormqr_t_right": lambda dt: (lambda a, c: torch.ormqr(*torch.geqrf(a), c, left=False,
                                                         transpose=True), gen(dt, 5, 3), gen(dt, 2, 5)),
    "eigvalsh": lambda dt: (torch.linalg.eigvalsh, sym(dt, 3, 6, 6)),
    "eigvalsh_odd": lambda dt: (lambda a: torch.linalg.eigvalsh(a, UPLO="U"), sym(dt, 7, 7)),
    "svdvals": lambda dt: (torch.linalg.svdvals, gen(dt, 2, 6, 4)),
    "svdvals_wide": lambda dt: (torch.linalg.svdvals, gen(dt, 3, 7)),
    "matrix_rank": lambda dt: (torch.linalg.matrix_rank, gen(dt, 5, 3) @ gen(dt, 3, 5, seed=1)),
    "pinv": lambda dt: (torch.linalg.pinv, gen(dt, 5, 3)),
    "inv_empty": lambda dt: (torch.linalg.inv, gen(dt, 0, 0)),
    "matrix_exp": lambda dt: (torch.linalg.matrix_exp, gen(dt, 3, 4, 4) * 0.5),
    "lstsq_tall": lambda dt: (torch.linalg.lstsq, gen(dt, 2, 6, 3), gen(dt, 2, 6, 2, seed=1)),
    "lstsq_wide_gels": lambda dt: (lambda a, b: torch.linalg.lstsq(a, b, driver="gels"),
                                   gen(dt, 3, 5), gen(dt, 3, 2, seed=1)),
    "lstsq_residuals": lambda dt: (lambda a, b: torch.linalg.lstsq(a, b, driver="gels"),
                                   gen(dt, 2, 6, 3), gen(dt, 2, 6, seed=1)),
}


# float64 for a few cases (same programs otherwise; each compile costs time)
F64_CASES = {"inv", "solve", "det", "slogdet", "qr", "cholesky", "eigvalsh",
             "matrix_exp", "lstsq_tall"}


# aten::cholesky (torch.cholesky, deprecated since 1.9 for torch.linalg.cholesky) is gone from
# torch 2.14 on, where torch.cholesky only raises: there is nothing to compare, so that case runs
# only on the releases that still have the op.
_NO_LEGACY_CHOLESKY = pytest.mark.skipif(
    not hasattr(torch.ops.aten, "cholesky"),
    reason=f"torch {torch.__version__} has no aten::cholesky (removed in 2.14; torch.cholesky "
           "only raises there)")


def _case(c, dt):
    return pytest.param(c, dt, marks=_NO_LEGACY_CHOLESKY if c == "cholesky_legacy" else ())


@pytest.mark.parametrize("case,dt", [_case(c, torch.float32) for c in sorted(CASES)] +
                         [_case(c, torch.float64) for c in sorted(F64_CASES)], ids=str)
def test_against_cpu(case, dt):
    fn, *args = CASES[case](dt)
    check(fn, *args, dt=dt)


def _eigh_check(a, uplo, dt):
    w, v = torch.linalg.eigh(a.to(TPU), UPLO=uplo)
    we, ve = torch.linalg.eigh(a, UPLO=uplo)
    w, v = w.cpu(), v.cpu()
    torch.testing.assert_close(w, we, **tol(dt))
    torch.testing.assert_close(v.abs(), ve.abs(), **tol(dt))
    full = torch.tril(a) + torch.tril(a, -1).mH if uplo == "L" else torch.triu(a) + torch.triu(a, 1).mH
    torch.testing.assert_close(v @ torch.diag_embed(w).to(dt) @ v.mH, full, **tol(dt))


@pytest.mark.parametrize("shape,uplo,dt", [((5, 5), "L", torch.float32),
                                           ((2, 6, 6), "U", torch.float64),
                                           ((1, 1), "L", torch.float32),
                                           ((2, 0, 0), "L", torch.float32)], ids=str)
def test_eigh(shape, uplo, dt):
    # a non-symmetric input: only the UPLO triangle may be read
    _eigh_check(gen(dt, *shape), uplo, dt)


@pytest.mark.parametrize("shape,full,dt", [
    ((5, 5), False, torch.float32), ((6, 4), True, torch.float32), ((4, 6), False, torch.float64),
    ((2, 7, 3), False, torch.float32),
    ((0, 0), False, torch.float32), ((3, 0), True, torch.float32), ((0, 3), False, torch.float32)],
    ids=str)
def test_svd(shape, full, dt):
    a = gen(dt, *shape)
    u, s, vh = (t.cpu() for t in torch.linalg.svd(a.to(TPU), full_matrices=full))
    ue, se, vhe = torch.linalg.svd(a, full_matrices=full)
    assert (u.shape, s.shape, vh.shape) == (ue.shape, se.shape, vhe.shape)
    assert u.dtype == ue.dtype and s.dtype == se.dtype
    k = s.shape[-1]
    torch.testing.assert_close(s, se, **tol(dt))
    torch.testing.assert_close(u[..., :k].abs(), ue[..., :k].abs(), **tol(dt))
    torch.testing.assert_close(vh[..., :k, :].abs(), vhe[..., :k, :].abs(), **tol(dt))
    eye_u = torch.eye(u.shape[-1], dtype=dt).expand(u.shape[:-2] + (u.shape[-1],) * 2)
    torch.testing.assert_close(u.mT @ u, eye_u, **tol(dt))
    torch.testing.assert_close(u[..., :k] @ torch.diag_embed(s).to(dt) @ vh[..., :k, :], a, **tol(dt))


@pytest.mark.parametrize("shape", [(2, 5, 5), (4, 6)])
def test_complex_eigh_svd(shape):
    dt = torch.complex64
    a = gen(dt, *shape)
    if shape[-1] == shape[-2]:
        _eigh_check(a + a.mH, "L", dt)
    u, s, vh = (t.cpu() for t in torch.linalg.svd(a.to(TPU), full_matrices=False))
    ue, se, vhe = torch.linalg.svd(a, full_matrices=False)
    assert u.dtype == dt and s.dtype == torch.float32
    torch.testing.assert_close(s, se, **tol(dt))
    torch.testing.assert_close(u.abs(), ue.abs(), **tol(dt))
    torch.testing.assert_close(u @ torch.diag_embed(s).to(dt) @ vh, a, **tol(dt))


@pytest.mark.parametrize("case", ["solve", "slogdet", "qr", "ormqr_t_right"])
def test_complex(case):
    dt = torch.complex64
    fn, *args = CASES[case](dt)
    check(fn, *args, dt=dt)


@pytest.mark.parametrize("dt", [torch.float32, torch.float64], ids=str)
def test_ldl(dt):
    # one matrix that takes 1x1 pivots only, and ones that force interchanges and 2x2 blocks
    a = sym(dt, 4, 5, 5)
    a[1, 0, 0] = 0.01
    a[2, 0, 0] = 0.0
    a[2, 1, 1] = 0.0
    a[3] = torch.eye(5, dtype=dt) * 4 + 0.1 * a[3]
    ld, piv, info = (t.cpu() for t in torch.linalg.ldl_factor_ex(a.to(TPU)))
    lde, pive, infoe = torch.linalg.ldl_factor_ex(a)
    assert torch.equal(piv, pive) and torch.equal(info, infoe)
    assert (pive < 0).any() and (pive[3] > 0).all()
    torch.testing.assert_close(ld, lde, **tol(dt))
    b = gen(dt, 4, 5, 2, seed=1)
    x = torch.linalg.ldl_solve(lde.to(TPU), pive.to(TPU), b.to(TPU)).cpu()
    torch.testing.assert_close(x, torch.linalg.ldl_solve(lde, pive, b), **tol(dt))


def test_svd_rank_deficient():
    a = gen(torch.float64, 6, 2) @ gen(torch.float64, 2, 4, seed=1)
    u, s, vh = (t.cpu() for t in torch.linalg.svd(a.to(TPU), full_matrices=True))
    torch.testing.assert_close(s, torch.linalg.svdvals(a), atol=1e-12, rtol=1e-9)
    torch.testing.assert_close(u.mT @ u, torch.eye(6, dtype=torch.float64))
    torch.testing.assert_close(vh @ vh.mT, torch.eye(4, dtype=torch.float64))
    torch.testing.assert_close((u[:, :4] * s) @ vh, a)


def test_singular_info_and_errors():
    a = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    _, _, info = torch.linalg.lu_factor_ex(a.to(TPU))
    assert info.cpu().item() == torch.linalg.lu_factor_ex(a)[2].item() == 2
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.inv(a.to(TPU))
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.cholesky(-torch.eye(3).to(TPU))
    assert torch.linalg.det(a.to(TPU)).cpu().item() == 0.0
    sign, logabs = torch.linalg.slogdet(a.to(TPU))
    assert sign.cpu().item() == 0.0 and logabs.cpu().item() == float("-inf")


GRADS = {
    "det": (torch.linalg.det, lambda: gen(torch.float64, 2, 4, 4)),
    "slogdet": (lambda a: torch.linalg.slogdet(a)[1], lambda: gen(torch.float64, 4, 4)),
    "solve": (lambda a: torch.linalg.solve(a, torch.ones(4, 2, dtype=a.dtype, device=a.device)),
              lambda: wc(torch.float64, 4, 4)),
    "cholesky": (lambda a: torch.linalg.cholesky(a @ a.mT + 4 * torch.eye(4, dtype=a.dtype,
                                                                           device=a.device)),
                 lambda: gen(torch.float64, 4, 4)),
    "qr": (lambda a: torch.linalg.qr(a)[1], lambda: gen(torch.float64, 5, 3)),
    "eigvalsh": (torch.linalg.eigvalsh, lambda: sym(torch.float64, 4, 4)),
    "svdvals": (torch.linalg.svdvals, lambda: gen(torch.float64, 5, 3)),
    "pinv": (torch.linalg.pinv, lambda: gen(torch.float64, 5, 3)),
}


@pytest.mark.parametrize("case", sorted(GRADS))
def test_grad(case):
    fn, make = GRADS[case]
    a = make()
    grads = []
    for dev in ("cpu", TPU):
        x = a.to(dev).requires_grad_(True)
        out = fn(x)
        (g,) = torch.autograd.grad(out.sum(), x)
        grads.append(g.cpu())
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-8, atol=1e-8)
