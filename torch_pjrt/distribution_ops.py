"""Gamma and Dirichlet sampling on tpu (aten::_standard_gamma, aten::_sample_dirichlet): the
samplers behind torch.distributions' Gamma, Beta, Dirichlet, Chi2 and StudentT. Without them
each sample went through the CPU fallback.

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
_NAMES = {torch.float16: "Half", torch.bfloat16: "BFloat16", torch.float32: "Float",
          torch.float64: "Double"}


def _compute_dtype(alpha: torch.Tensor, kernel: str) -> torch.dtype:
    if alpha.dtype not in _NAMES:  # integers, bool, complex: CPU's NotImplementedError
        name = torch.empty(0, dtype=alpha.dtype).type().split(".")[-1][:-len("Tensor")]
        raise NotImplementedError(f'"{kernel}" not implemented for \'{name}\'')
    return torch.float64 if alpha.dtype == torch.float64 else torch.float32


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
    order = torch.arange(ROUNDS, device=a.device).reshape((ROUNDS,) + (1,) * a.dim())
    first = torch.where(accepted, order, ROUNDS - 1).amin(0, keepdim=True)
    sample = d * v.clamp_min(0).gather(0, first).squeeze(0)
    scale = torch.rand(tuple(a.shape), **kw) ** (1.0 / a)
    sample = torch.where(small, sample * scale, sample)
    sample = torch.where(a > 0, sample, 0.0)  # alpha <= 0 or NaN: CPU gives the tiny value
    return torch.where(torch.isposinf(a), a, sample)


def _standard_gamma(alpha: torch.Tensor, generator=None) -> torch.Tensor:
    ct = _compute_dtype(alpha, "gamma_tpu")
    out = _gamma(alpha.to(ct), generator)
    return out.clamp_min(torch.finfo(ct).tiny).to(alpha.dtype)


def _sample_dirichlet(alpha: torch.Tensor, generator=None) -> torch.Tensor:
    ct = _compute_dtype(alpha, "dirichlet")
    tiny = torch.finfo(ct).tiny
    g = _gamma(alpha.to(ct), generator).clamp_min(tiny)
    return (g / g.sum(-1, keepdim=True)).clamp_min(tiny).to(alpha.dtype)


def register() -> None:
    """Registers the kernels once per process (idempotent)."""
    if _LIBS:
        return
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_standard_gamma", _standard_gamma, "PrivateUse1")
    lib.impl("_sample_dirichlet", _sample_dirichlet, "PrivateUse1")
    _LIBS.append(lib)
