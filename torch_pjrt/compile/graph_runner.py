"""One AOTAutograd graph (forward, backward or inference) on the tpu device.

First call for a given input signature (dtypes, sizes, strides, offsets, storage sizes, which
inputs share a storage, and the values of non-tensor inputs): the FX graph runs once under a
capture of the defer_and_fuse recorder (every node is dispatched, lowered and recorded, nothing
runs), and the recorded graph becomes a plan: one program (compiled, or loaded from the memory
and disk caches) whose parameters are the inputs' storages and whose results are written into
mutated inputs and into fresh output storages. That first call's results come from running the
plan. Every later call with the same signature is one program execution: no FX interpretation,
no dispatch, no Meta kernels; outputs are views (as recorded) of fresh storages.

What is not captured runs each call through the defer_and_fuse recorder (same lowerings, fused,
but dispatched op by op): graphs with random ops (a plan would replay the same random numbers;
they must draw from the tpu generator on every call), graphs whose run forced a flush (a host
read, a CPU fallback, a data-dependent shape), inputs on another device, and outputs that are
not tpu tensors or static values.
"""
from __future__ import annotations

import os

import torch

from .. import modes
from ..device import _C


def _has_random_ops(gm: torch.fx.GraphModule) -> bool:
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            if torch.Tag.nondeterministic_seeded in node.target.tags:
                return True
    return False


def _signature(args) -> tuple | None:
    """Everything a plan depends on, or None when the call cannot use one."""
    sig = []
    storages: dict[int, int] = {}
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            if a.device.type != "tpu":
                return None
            st = a.untyped_storage()  # (one call: this runs for every input of every call)
            sig.append((a.dtype, a.device.index, a.shape, a.stride(), a.storage_offset(),
                        st.nbytes(), storages.setdefault(st.data_ptr(), i)))
        elif a is None or isinstance(a, (bool, int, float, str, torch.dtype, torch.device)):
            sig.append((type(a), a))
        else:
            return None  # SymInts and other objects: not specialized here
    return tuple(sig)


class _Capture:
    """A plan and how to rebuild the graph's outputs around its result storages."""

    __slots__ = ("plan", "out_storages", "layout", "sequence_type", "device")

    def run(self, args, plan_inputs=None):
        """Runs the plan over `plan_inputs` (default: the tensors among `args`, as captured) and
        returns the outputs; outputs that alias an input are views of ``args[i]``."""
        if plan_inputs is None:
            plan_inputs = [a for a in args if isinstance(a, torch.Tensor)]
        bases = [torch.empty(n, dtype=dt, device=self.device) for n, dt in self.out_storages]
        self.plan.run(plan_inputs, bases)
        out = []
        for kind, where, meta in self.layout:
            if kind == "value":
                out.append(where)
            else:
                src = bases[where] if kind == "out" else args[where]
                out.append(src.as_strided(*meta))
        return self.sequence_type(out)


class GraphRunner:
    """Callable for AOTAutograd (boxed by the backend): runs the graph, captured when it can be."""

    def __init__(self, gm: torch.fx.GraphModule, name: str, opts: dict):
        self.gm = gm
        self.name = name
        self.debug_dir = opts["debug_dir"]
        self.capture = opts["capture"] and not _has_random_ops(gm)
        self.plans: dict[tuple, _Capture] = {}
        self.uncapturable: set[tuple] = set()
        if self.debug_dir:
            with open(os.path.join(self.debug_dir, f"{name}.fx.py"), "w") as f:
                f.write(gm.code)

    def __call__(self, *args):
        sig = _signature(args) if self.capture else None
        if sig is not None:
            entry = self.plans.get(sig)
            if entry is not None:
                return entry.run(args)
            if sig not in self.uncapturable:
                return self._capture(sig, args)
        return self._run_recorded(args)

    def _run_recorded(self, args):
        with modes.eager_mode("defer_and_fuse"):
            return self.gm(*args)

    def _capture(self, sig, args):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        with modes.eager_mode("defer_and_fuse"):
            _C._capture_begin()
            try:
                outs = self.gm(*args)
            except BaseException:
                _C._capture_abort()
                raise
            entry, out_storage_tensors = self._describe(outs, args, tensors)
            if entry is None:
                _C._capture_abort()
                self.uncapturable.add(sig)
                return outs
            plan = _C._capture_end(tensors, out_storage_tensors)
        if plan is None:
            self.uncapturable.add(sig)
            return outs
        entry.plan = plan
        self.plans[sig] = entry
        if self.debug_dir:
            suffix = f"_{len(self.plans) - 1}" if len(self.plans) > 1 else ""
            with open(os.path.join(self.debug_dir, f"{self.name}{suffix}.stablehlo.mlir"), "w") as f:
                f.write(plan.text())
        return outs

    @staticmethod
    def _describe(outs, args, tensors):
        """The outputs' layout relative to the inputs and to new storages, or (None, None) when
        some output cannot be rebuilt from a plan's results."""
        if not isinstance(outs, (list, tuple)):
            return None, None
        input_storage = {}
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                input_storage.setdefault(a.untyped_storage().data_ptr(), i)
        entry = _Capture()
        entry.sequence_type = type(outs)
        entry.device = tensors[0].device if tensors else None
        entry.layout, entry.out_storages = [], []
        new_storage: dict[int, int] = {}
        reps = []
        for o in outs:
            if not isinstance(o, torch.Tensor):
                if o is not None and not isinstance(o, (bool, int, float)):
                    return None, None
                entry.layout.append(("value", o, None))
                continue
            if o.device.type != "tpu":
                return None, None
            entry.device = o.device
            meta = (tuple(o.shape), o.stride(), o.storage_offset())
            ptr = o.untyped_storage().data_ptr()
            if ptr in input_storage:
                entry.layout.append(("input", input_storage[ptr], meta))
                continue
            j = new_storage.get(ptr)
            if j is None:
                nbytes = o.untyped_storage().nbytes()
                if nbytes % o.element_size():
                    return None, None
                j = new_storage[ptr] = len(entry.out_storages)
                entry.out_storages.append((nbytes // o.element_size(), o.dtype))
                reps.append(o)
            elif entry.out_storages[j][1] != o.dtype:
                return None, None  # one storage read as two element types
            entry.layout.append(("out", j, meta))
        return entry, reps
