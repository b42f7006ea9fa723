"""Per-op precision audit: is each aten op on `tpu` as accurate as CPU's on the same inputs?

A model whose float32 results differ from CPU's by more than the tolerance, yet match in
float64, is either amplifying ordinary float32 rounding (batch norm over a few values per
channel, near-ties at ReLUs and max pools) or computing some op less accurately than CPU. The
model-level figures cannot tell these apart when the model amplifies CPU's own rounding as
much: which tensor the amplified error lands in varies from run to run. The audit looks one op
at a time instead. Under `OpAudit`, every aten op that runs with a `tpu` tensor argument is run
again on CPU, on copies of the very same inputs taken before the op ran, once in float32 and
once in float64. For each float32 output it records tpu's error and CPU float32's error, both
against CPU's float64 result and both as max |x - ref| / (1 + |ref|): an op whose tpu error is
many times CPU's is less accurate than CPU's kernel, whatever the model does with it. Integer
and bool outputs must equal CPU's.

Views and exact ops are audited too (their errors are zero unless the op is wrong); copies
between devices, uninitialized memory and ops that draw random numbers are not.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

# A CPU float32 error below this (about half an ulp at 1) counts as this, so an op CPU happens
# to compute exactly does not make one ulp of difference look like an infinite ratio.
ERR_FLOOR = 6e-8

_NOT_COMPUTED = {
    # copies between devices (a device argument, and exact anyway)
    "_to_copy", "copy_", "to", "lift_fresh", "lift_fresh_copy",
    # uninitialized memory or random numbers: nothing to compare
    "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "bernoulli",
    "bernoulli_", "uniform_", "normal_", "exponential_", "geometric_", "random_", "rand_like",
    "randn_like", "randint_like", "native_dropout", "multinomial", "_fused_dropout",
    "set_", "resize_",
}


@dataclass
class OpWorst:
    op: str
    calls: int = 0
    ratio: float = 0.0  # tpu error / max(CPU float32 error, ERR_FLOOR), at its worst call
    tpu_err: float = 0.0
    cpu_err: float = 0.0
    inputs: str = ""


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    fin = torch.isfinite(ref) & torch.isfinite(x)
    if not bool(fin.any()):
        return 0.0
    return float(((x - ref).abs() / (1 + ref.abs()))[fin].max())


def _cpu_copy(tree, dtype=None):
    def f(a):
        if isinstance(a, torch.device) and a.type == "tpu":  # a factory's device= argument
            return torch.device("cpu")
        if not isinstance(a, torch.Tensor):
            return a
        c = a.detach().to("cpu", copy=True)
        return c.to(dtype) if dtype is not None and c.is_floating_point() else c
    return tree_map(f, tree)


def _on_tpu(flat) -> bool:
    return any(isinstance(a, torch.Tensor) and a.device.type == "tpu" for a in flat)


def _random(func) -> bool:
    return any("Generator" in str(a.type) for a in func._schema.arguments)


class OpAudit(TorchDispatchMode):
    """Records, per op name, the worst call (see the module docstring). `skipped` counts the
    calls CPU could not run again (e.g. an op without a float64 CPU kernel)."""

    def __init__(self):
        super().__init__()
        self.ops: Dict[str, OpWorst] = {}
        self.skipped: Dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        flat_in, _ = tree_flatten((args, kwargs))
        audit = _on_tpu(flat_in) and name not in _NOT_COMPUTED and not _random(func)
        if audit:  # copies before the op runs: in-place ops and out= overwrite their inputs
            c32 = _cpu_copy((args, kwargs))
            c64 = _cpu_copy((args, kwargs), torch.float64)
        out = func(*args, **kwargs)
        if not audit:
            return out
        flat_out, _ = tree_flatten(out)
        try:
            with torch.no_grad():
                o32, _ = tree_flatten(func(*c32[0], **c32[1]))
                o64, _ = tree_flatten(func(*c64[0], **c64[1]))
        except Exception:
            self.skipped[name] = self.skipped.get(name, 0) + 1
            return out
        w = self.ops.setdefault(name, OpWorst(name))
        w.calls += 1
        for t, r32, r64 in zip(flat_out, o32, o64):
            if (isinstance(t, torch.Tensor) and isinstance(r32, torch.Tensor)
                    and not t.is_floating_point() and not t.is_complex() and t.shape == r32.shape
                    and not torch.equal(t.detach().to("cpu"), r32)):
                # integer outputs (max-pool indices, sort order) must equal CPU's on the same
                # inputs: a different tie rule is a different function, not rounding
                w.ratio, w.tpu_err, w.cpu_err = float("inf"), float("inf"), 0.0
                w.inputs = "integer output differs from CPU's on the same inputs"
                continue
            if not (isinstance(t, torch.Tensor) and t.dtype == torch.float32
                    and isinstance(r32, torch.Tensor) and isinstance(r64, torch.Tensor)
                    and r32.dtype == torch.float32 and t.shape == r64.shape):
                continue
            et = _rel_err(t.detach().to("cpu"), r64)
            ec = _rel_err(r32, r64)
            ratio = et / max(ec, ERR_FLOOR)
            if ratio > w.ratio:
                shapes = [tuple(a.shape) for a in flat_in if isinstance(a, torch.Tensor)]
                w.ratio, w.tpu_err, w.cpu_err, w.inputs = ratio, et, ec, str(shapes)[:160]
        return out

    def worst(self, n: int = 10) -> List[OpWorst]:
        return sorted(self.ops.values(), key=lambda w: -w.ratio)[:n]
