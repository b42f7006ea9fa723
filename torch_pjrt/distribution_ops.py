"""Gamma, Dirichlet and Poisson sampling on tpu (aten::_standard_gamma, _sample_dirichlet,
poisson): the samplers behind torch.poisson and torch.distributions' Gamma, Beta, Dirichlet,
Chi2, StudentT and Poisson. Without them each sample went through the CPU fallback.

Gamma(alpha, 1) uses Marsaglia and Tsang's squeeze-free rejection method: for alpha >= 1, with
d = alpha - 1/3 and c = 1 / sqrt(9 d), a standard normal x gives the candidate d (1 + c x)^3,
accepted when log(u) < x^2 / 2 + d - d v + d log(v) (v = (1 + c x)^3 > 0, u uniform). Shapes on
an accelerator are static, so every element draws ROUNDS candidates at once and keeps its first
accepted one. A candidate is accepted with probability above 0.95 for every alpha >= 1, so all
ROUNDS fail with probability below 0.05^16 (about 1.5e-21) per element; such an element keeps
its last candidate. For alpha < 1 the sample of alpha + 1 is scaled by u^(1/alpha).

Edge values follow CPU's kernel: results are at least the dtype's smallest normal number (also
for alpha <= 0 and NaN), alpha = inf gives inf, and a Dirichlet sample is the gammas over their
sum, again at least the smallest normal number. The random streams differ from CPU's (as CUDA's
do): the same seed gives the same samples on tpu, not CPU's samples.

Gradients (_standard_gamma_grad, _dirichlet_grad: reparameterized samples) are not lowered and
take the CPU fallback.
"""
from __future__ import annotations

import torch

ROUNDS = 16
_LIBS: list = []
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _compute_dtype(alpha: torch.Tensor, kernel: str) -> torch.dtype:
    if alpha.dtype not in _FLOATS:  # integers, bool, complex: CPU's NotImplementedError
        name = torch.empty(0, dtype=alpha.dtype).type().split(".")[-1][:-len("Tensor")]
        raise NotImplementedError(f'"{kernel}" not implemented for \'{name}\'')
    return torch.float64 if alpha.dtype == torch.float64 else torch.float32


def _at_least_tiny(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in dtype, at least dtype's smallest normal number (CPU's floor for these samplers)."""
    return x.clamp_min(torch.finfo(x.dtype).tiny).to(dtype).clamp_min(torch.finfo(dtype).tiny)


def _first_accepted(candidates: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
    """Per element, the first of the ROUNDS candidates (dim 0) that was accepted, else the last."""
    order = torch.arange(ROUNDS, device=candidates.device)
    order = order.reshape((ROUNDS,) + (1,) * (candidates.dim() - 1))
    first = torch.where(accepted, order, ROUNDS - 1).amin(0, keepdim=True)
    return candidates.gather(0, first).squeeze(0)


def _gamma(a: torch.Tensor, generator) -> torch.Tensor:
    """Gamma(a, 1) samples in a's dtype (float32 or float64), before CPU's clamping."""
    kw = dict(generator=generator, device=a.device, dtype=a.dtype)
    small = a < 1
    boosted = torch.where(small, a + 1, a)
    d = boosted - 1.0 / 3.0
    c = torch.rsqrt(9.0 * d)
    rounds = (ROUNDS,) + tuple(a.shape)
    x = torch.randn(rounds, **kw)
    u = torch.rand(rounds, **kw)
    v = (1.0 + c * x) ** 3
    accepted = (v > 0) & (torch.log(u) < 0.5 * x * x + d - d * v + d * torch.log(v))
    sample = d * _first_accepted(v.clamp_min(0), accepted)
    scale = torch.rand(tuple(a.shape), **kw) ** (1.0 / a)
    sample = torch.where(small, sample * scale, sample)
    sample = torch.where(a > 0, sample, 0.0)  # alpha <= 0 or NaN: CPU gives the tiny value
    return torch.where(torch.isposinf(a), a, sample)


def _standard_gamma(alpha: torch.Tensor, generator=None) -> torch.Tensor:
    ct = _compute_dtype(alpha, "gamma_tpu")
    return _at_least_tiny(_gamma(alpha.to(ct), generator), alpha.dtype)


def _sample_dirichlet(alpha: torch.Tensor, generator=None) -> torch.Tensor:
    ct = _compute_dtype(alpha, "dirichlet")
    tiny = torch.finfo(ct).tiny
    g = _gamma(alpha.to(ct), generator).clamp_min(tiny)
    return _at_least_tiny(g / g.sum(-1, keepdim=True), alpha.dtype)


# Poisson(rate): below SMALL_RATE by inversion over the first INVERSION_TERMS values (the
# cumulative probabilities against one uniform; P(X >= 48) < 1e-15 at rate 10), from SMALL_RATE
# on by Hoermann's transformed rejection with squeeze (PTRS), ROUNDS candidates at once (each
# accepted with probability above 0.85, so all fail with probability below 1e-13).
SMALL_RATE = 10.0
INVERSION_TERMS = 48


def _log_poisson_pmf(k: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """log P(X = k) for X ~ Poisson(lam), k >= 0, accurate in float32 also for rates of 1e6:
    k log(lam/k) + (k - lam) - log(2 pi k)/2 - Stirling's correction, instead of -lam + k
    log(lam) - lgamma(k + 1), whose terms cancel to about 1e-7 of their size (1e7 at 1e6)."""
    kk = k.clamp_min(1.0)
    corr = 1.0 / (12.0 * kk) - 1.0 / (360.0 * kk ** 3) + 1.0 / (1260.0 * kk ** 5)
    stable = (kk * torch.log1p((lam - kk) / kk) + (kk - lam)
              - 0.5 * torch.log(2 * torch.pi * kk) - corr)
    direct = torch.xlogy(k, lam) - lam - torch.lgamma(k + 1.0)
    return torch.where(k < 10, direct, stable)


def _poisson_small(lam: torch.Tensor, generator) -> torch.Tensor:
    kw = dict(generator=generator, device=lam.device, dtype=lam.dtype)
    k = torch.arange(INVERSION_TERMS, device=lam.device, dtype=lam.dtype)
    k = k.reshape((INVERSION_TERMS,) + (1,) * lam.dim())
    cdf = torch.cumsum(torch.exp(torch.xlogy(k, lam) - lam - torch.lgamma(k + 1.0)), 0)
    u = torch.rand(tuple(lam.shape), **kw)
    return (cdf < u).sum(0).to(lam.dtype)


def _poisson_large(lam: torch.Tensor, generator) -> torch.Tensor:
    kw = dict(generator=generator, device=lam.device, dtype=lam.dtype)
    b = 0.931 + 2.53 * torch.sqrt(lam)
    a = -0.059 + 0.02483 * b
    inv_alpha = 1.1239 + 1.1328 / (b - 3.4)
    v_r = 0.9277 - 3.6224 / (b - 2)
    rounds = (ROUNDS,) + tuple(lam.shape)
    u = torch.rand(rounds, **kw) - 0.5
    v = torch.rand(rounds, **kw)
    us = 0.5 - u.abs()
    k = torch.floor((2 * a / us + b) * u + lam + 0.43)
    squeeze = (us >= 0.07) & (v <= v_r)
    possible = (k >= 0) & ~((us < 0.013) & (v > us))
    bound = torch.log(v) + torch.log(inv_alpha) - torch.log(a / (us * us) + b)
    accepted = squeeze | (possible & (bound <= _log_poisson_pmf(k.clamp_min(0), lam)))
    return _first_accepted(k.clamp_min(0), accepted)


def _poisson(rate: torch.Tensor, generator=None) -> torch.Tensor:
    ct = _compute_dtype(rate, "poisson_tpu")
    lam = rate.to(ct)
    # CPU checks every rate; so does tpu, at the cost of one host sync per call
    if lam.numel() and bool(((lam < 0) | torch.isnan(lam)).any()):
        raise RuntimeError("invalid Poisson rate, expected rate to be non-negative")
    small = lam < SMALL_RATE
    out = torch.where(small, _poisson_small(torch.where(small, lam, 0.0), generator),
                      _poisson_large(torch.where(small, SMALL_RATE, lam), generator))
    # an infinite rate: inf (CPU's kernel returns an undefined integer conversion there)
    return torch.where(torch.isposinf(lam), lam, out).to(rate.dtype)


def register() -> None:
    """Registers the kernels once per process (idempotent)."""
    if _LIBS:
        return
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_standard_gamma", _standard_gamma, "PrivateUse1")
    lib.impl("_sample_dirichlet", _sample_dirichlet, "PrivateUse1")
    lib.impl("poisson", _poisson, "PrivateUse1")
    _LIBS.append(lib)
