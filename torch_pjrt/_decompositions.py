"""Routes aten ops that have no StableHLO lowering through PyTorch's own decompositions.

An op reaching the tpu backend is handled, in order, by: a C lowering (csrc/ops), else a
decomposition from torch._decomp registered here as the op's PrivateUse1 kernel (it re-enters
the dispatcher with simpler ops), else the CPU fallback (csrc/bridge/dispatch.cpp). Only ops
without a lowering and without a CompositeImplicitAutograd kernel get a decomposition, so a
lowering always wins and composite ops keep decomposing above autograd as PyTorch intends.
"""
import torch

_LIB = None
_KEYS_THAT_ALREADY_WORK = (
    "CompositeImplicitAutograd",
    "CompositeExplicitAutograd",
    "CompositeExplicitAutogradNonFunctional",
    "PrivateUse1",
)
registered: list = []


def _base_name(op: torch._ops.OpOverload) -> str:
    name = op._schema.name.split("::", 1)[1]
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]
    return name


def register(lowered: set) -> None:
    """Registers decompositions once per process (idempotent)."""
    global _LIB
    if _LIB is not None:
        return
    from torch._decomp import decomposition_table

    _LIB = torch.library.Library("aten", "IMPL")
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    for op, fn in decomposition_table.items():
        if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
            continue
        name = op.name()
        if _base_name(op) in lowered:
            continue
        if any(has_kernel(name, k) for k in _KEYS_THAT_ALREADY_WORK):
            continue
        try:
            _LIB.impl(op, fn, "PrivateUse1")
        except RuntimeError:
            continue  # already registered by someone else: theirs stands
        registered.append(name)
