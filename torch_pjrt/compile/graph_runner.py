"""One AOTAutograd graph (forward, backward or inference) on the tpu device.

First call for a given input signature (dtypes, sizes, strides, offsets, storage sizes, which
inputs share a storage, and the values of non-tensor inputs): the FX graph runs once under a
capture of the defer_and_fuse recorder (every node is dispatched, lowered and recorded, nothing
runs), and the recorded graph becomes a plan: one program (compiled, or loaded from the memory
and disk caches) whose parameters are the inputs' storages and whose results are written into
mutated inputs and into fresh output storages. That first call's results come from running the
plan. Every later call with the same signature is one program execution: no FX interpretation,
no dispatch, no Meta kernels; outputs are views (as recorded) of fresh storages.

Random ops (dropout, rand, bernoulli, ...) are captured too: their generator seed and offset are
two arguments of the program, not constants (csrc/include/torch_pjrt/capture.h). Every call
takes them from the device's default tpu generator and advances it as far as the graph's random
ops did at capture, so a call draws exactly what the same ops run eagerly would draw,
torch.manual_seed reproduces it, two calls draw different numbers, and eager ops afterwards
continue the same stream. In a training graph the forward's dropout mask is an output saved for
the backward graph, which reads it instead of drawing again.

What is not captured runs each call through the defer_and_fuse recorder (same lowerings, fused,
but dispatched op by op): graphs with a random op that draws from a generator other than the
device's default one (a `generator=` argument; a plan only replays default-generator draws),
graphs whose run forced a flush (a host read, a CPU fallback, a data-dependent shape), inputs on
another device, and outputs that are not tpu tensors or static values.

A GraphRunner is an Inductor ``OutputCode`` (the type AOTAutograd's bundled cache serializes),
and pickles as its FX graph, name and options; plans are rebuilt on the first call after
unpickling (the programs come from the persistent cache). That is what makes PyTorch's
ahead-of-time compilation work with this backend: ``torch.compile(fn, fullgraph=True,
backend="tpu").aot_compile(...)``, ``save_compiled_function`` and, in another process,
``torch.compiler.load_compiled_function``, which skips Dynamo and AOTAutograd.
"""
from __future__ import annotations

import functools
import linecache
import os
import re

import torch
from torch._inductor.output_code import OutputCode
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from .. import modes
from . import attribution
from ..device import _C


def _entry(plan, layout, out_storages, sequence_type, device):
    """The per-call object of a captured graph (C++: runs the plan and rebuilds the outputs)."""
    return _C._GraphEntry(plan, out_storages, layout, sequence_type is tuple, device)


_ASSIGNED = re.compile(r"\s*(\w+) = ")
_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')
_registered: set[str] = set()


def _register_source_lines(gm: torch.fx.GraphModule) -> None:
    """Tells the bridge the user's source line of each node on each line of the graph's
    generated code (from the node's recorded stack trace), so a device-side index check in a
    compiled graph names the user's line, not the generated one. Once per generated file."""
    code = getattr(getattr(gm, "forward", None), "__code__", None)
    file = code.co_filename if code is not None else ""
    if not file.startswith("<eval_with_key>") or file in _registered:
        return
    _registered.add(file)
    nodes = {n.name: n for n in gm.graph.nodes}
    sites = {}
    for number, text in enumerate(linecache.getlines(file), 1):
        m = _ASSIGNED.match(text)
        node = nodes.get(m.group(1)) if m else None
        found = _FILE_LINE.findall(node.meta.get("stack_trace") or "") if node is not None else []
        if found:
            sites[number] = "%s:%s" % found[-1]
    if sites:
        _C._set_source_lines(file, sites)


# A graph holding flex_attention keeps block-sparse programs for this many BlockMasks (their
# block lists' values); further masks run the dense kernels, one program for all.
MAX_MASKS_PER_GRAPH = 8


class GraphRunner(OutputCode):
    """Callable for AOTAutograd: runs the graph, captured when it can be."""

    # OutputCode is a dataclass: its generated __eq__ would make every GraphRunner equal to
    # every other and unhashable. Identity is what a compiled graph's equality means.
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def __init__(self, gm: torch.fx.GraphModule, name: str, opts: dict):
        # Boxed calling convention (one list of inputs). An instance attribute, not a class
        # one: wrappers made with functools.wraps (torch._dynamo.disable around a backward
        # reloaded from a serialized compiled function) copy it, so AOTAutograd keeps calling
        # the boxed way.
        self._boxed_call = True
        self.opts = opts
        self.gm = gm
        self.name = name
        self.debug_dir = opts["debug_dir"]
        self.capture = opts["capture"]
        # signature (bytes, _C._GraphCache.signature) -> _C._GraphEntry
        self.plans = _C._GraphCache()
        self.uncapturable: set[bytes] = set()
        # inputs that are a flex_attention BlockMask's block lists: read on the host before
        # each call, the plans kept apart per their values (flex_attention.py, block sparsity)
        self.block_mask_args = _block_mask_inputs(gm)
        self.plans_by_mask: dict[bytes, tuple] = {}
        if self.debug_dir:
            with open(os.path.join(self.debug_dir, f"{name}.fx.py"), "w") as f:
                f.write(gm.code)

    # ---- OutputCode: what AOTAutograd's bundled cache needs to serialize and reload it ----

    # The FX graph is pickled node by node (torch.fx's GraphPickler), not through
    # GraphModule.__reduce__: that one re-creates the graph by symbolically tracing its code,
    # which runs every op without tensor inputs at load time and bakes its result in as a
    # constant (a randn would draw once and never again; an arange becomes a tensor constant).

    # The graph module's own tensors (``get_attr`` constants, e.g. the empty key and value
    # tensors, ``torch.tensor([])``, that a Hugging Face Llama's forward puts in its KV cache
    # and concatenates the new keys to) are real tpu tensors that pickle by value
    # (Tensor.__reduce_ex__): their storage goes through torch.save / torch.load's legacy
    # format (UntypedStorage.__reduce__ and _load_from_bytes, torch/storage.py), whose loader
    # makes a *meta* storage and reads no data whenever a FakeTensorMode is on the dispatch mode
    # stack (torch/serialization.py, _legacy_load's persistent_load: ``if
    # torch._guards.active_fake_mode() is not None``), even one that ``no_dispatch()`` has
    # disabled. PyTorch 2.13 copies us in exactly that state when the Dynamo cache is on:
    # AOTAutogradCache.save (torch/_functorch/_aot_autograd/autograd_cache.py) records the
    # entry with PrecompileContext.record_artifact, which deep-copies it under no_dispatch()
    # (torch/_dynamo/precompile_context.py, meant to keep FakeTensorMode out) while the
    # compile's FakeTensorMode is still entered (create_aot_state, torch/_functorch/
    # aot_autograd.py); that copy is what save_cache_artifacts() writes, so a process loading
    # the frame from the Dynamo cache ran graphs whose constants were on meta. A compiled
    # graph's constants must be real whatever mode is around: both directions run with the
    # fake mode taken off the stack (unset_fake_temporarily; pickling under an enabled fake
    # mode would fail outright, the storage's copy to CPU being a real tensor's op).

    def __getstate__(self):
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        from torch.fx._graph_pickler import GraphPickler

        # without node.meta (tracing values: fake tensors, which would need a fake mode to
        # load; nothing here reads them), put back afterwards
        metas = [(node, node.meta) for node in self.gm.graph.nodes]
        gm_meta = self.gm.meta
        try:
            for node, _ in metas:
                node.meta = {}
            self.gm.meta = {}
            with unset_fake_temporarily():
                graph = GraphPickler.dumps(self.gm)
        finally:
            for node, meta in metas:
                node.meta = meta
            self.gm.meta = gm_meta
        return {"graph": graph, "name": self.name, "opts": self.opts}

    def __copy__(self):
        # AOTAutograd's pre_save copies the result before pickling it: a plain attribute copy,
        # not a round trip through __getstate__, whose pickling of a graph holding an op that
        # cannot be pickled (a c10d functional collective) must surface in the cache's own
        # save, which then skips caching, not in the copy, which fails the compile
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def __setstate__(self, state):
        from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
        from torch.fx._graph_pickler import GraphPickler

        with unset_fake_temporarily():  # real constants, not meta ones (above)
            gm = GraphPickler.loads(state["graph"], FakeTensorMode())
        gm.recompile()
        self.__init__(gm, state["name"], state["opts"])

    def prepare_for_serialization(self):
        pass  # nothing process-bound is pickled (see __getstate__)

    def post_compile(self, example_inputs, constants, graph_kwargs):
        pass  # nothing to redo after loading: plans are captured on first call

    def set_triton_bundle(self, triton_bundle):
        pass  # no Triton kernels

    def __call__(self, *args):
        # Boxed: one list of the graph's inputs (graph inputs are tensors and numbers, never
        # lists); some AOTAutograd paths (a reloaded backward) pass the inputs positionally.
        if len(args) == 1 and isinstance(args[0], list):
            args = tuple(args[0])
        if is_in_torch_dispatch_mode() and _modes_that_see_ops():
            if self.opts.get("wrap_compiled_regions"):
                return _as_compiled_region(self, args)
            # A mode on the stack (selective activation checkpointing, a FLOP counter, a fake
            # mode) sees the graph's own ops, the same ones on every call: the graph runs
            # recorded, op by op into one fused program, never as a plan, whose first call
            # (the capture) and later ones (a replay) would show the mode different ops
            return self._run_recorded(args)
        return self._call(args)

    def _call(self, args):
        if attribution.active is not None:
            # torch.tpu.step_profile(): this call's host time is a profiler range and the
            # programs it issues carry the graph's name on the execution timeline
            with torch.profiler.record_function(attribution.BACKEND_RANGE + self.name):
                _C._exec_profile_label(self.name)
                try:
                    return self._run(args)
                finally:
                    _C._exec_profile_label("")
        return self._run(args)

    def _run(self, args):
        if _C._capture_active():
            # inside an enclosing capture (a whole serving step, serving/vllm/step_capture.py):
            # the graph's ops are recorded into that one, not run as a plan of their own
            return self.gm(*args)
        if self.block_mask_args:
            from .. import flex_attention

            key = flex_attention.read_block_lists([args[i] for i in self.block_mask_args])
            plans = self.plans_by_mask.get(key)
            if plans is None and len(self.plans_by_mask) < MAX_MASKS_PER_GRAPH:
                plans = self.plans_by_mask[key] = (_C._GraphCache(), set())
            if plans is not None:
                return self._run_plans(args, *plans)
            # masks that change from call to call (document masking): one dense program for
            # all of them rather than a compile per mask
            with flex_attention.dense_kernels():
                return self._run_plans(args, self.plans, self.uncapturable)
        return self._run_plans(args, self.plans, self.uncapturable)

    def _run_plans(self, args, plans, uncapturable):
        if self.capture:
            outs = plans.run(args)  # None: no plan for these arguments yet
            if outs is not None:
                return outs
            sig = plans.signature(args)
            if sig is not None and sig not in uncapturable:
                return self._capture(sig, args, plans, uncapturable)
        return self._run_recorded(args)

    def _run_recorded(self, args):
        with modes.eager_mode("defer_and_fuse"):
            return self.gm(*args)

    def _capture(self, sig, args, plans, uncapturable):
        _register_source_lines(self.gm)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        with modes.eager_mode("defer_and_fuse"):
            # this thread's ops only: other threads (the ranks of run_threads, each running
            # its own compiled graphs) neither join nor break the capture
            _C._capture_begin(thread_only=True)
            try:
                outs = self.gm(*args)
            except BaseException:
                _C._capture_abort()
                raise
            layout, out_storage_tensors = self._describe(outs, args, tensors,
                                                         self._constant_storages())
            if layout is None:
                _C._capture_abort()
                uncapturable.add(sig)
                return outs
            plan = _C._capture_end(tensors, out_storage_tensors)
        if plan is None:
            uncapturable.add(sig)
            return outs
        plans.add(sig, _entry(plan, *layout))
        if self.debug_dir:
            suffix = f"_{len(plans) - 1}" if len(plans) > 1 else ""
            with open(os.path.join(self.debug_dir, f"{self.name}{suffix}.stablehlo.mlir"), "w") as f:
                f.write(plan.text())
        return outs

    def _constant_storages(self) -> set[int]:
        """Storages (data_ptr) of the graph module's own tensors (``get_attr`` nodes: lifted
        constants such as a causal mask or position ids)."""
        found = set()
        for node in self.gm.graph.nodes:
            if node.op == "get_attr":
                value = self.gm
                for part in node.target.split("."):
                    value = getattr(value, part)
                if isinstance(value, torch.Tensor) and value.device.type == "tpu":
                    found.add(value.untyped_storage().data_ptr())
        return found

    @staticmethod
    def _describe(outs, args, tensors, constants=frozenset()):
        """How to rebuild the outputs around a plan's results: ((layout, result storages,
        sequence type, device) for `_entry`, one output tensor per result storage), or
        (None, None) when some output cannot be rebuilt from a plan's results.

        An output on a storage of the graph's own constants (`constants`, data_ptrs: e.g. a
        position-ids tensor returned to be saved for backward) is returned as that very tensor
        on every call, as running the graph eagerly would: the plan holds the constant's
        storage (it is not a fresh result, and the graph reads it before any write)."""
        if not isinstance(outs, (list, tuple)):
            return None, None
        input_storage = {}
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                input_storage.setdefault(a.untyped_storage().data_ptr(), i)
        device = tensors[0].device if tensors else None
        layout, out_storages = [], []
        new_storage: dict[int, int] = {}
        reps = []
        for o in outs:
            if not isinstance(o, torch.Tensor):
                # numbers, and an input object handed back (a DeviceMesh a forward returns for
                # its backward: the signature keys plans on its groups)
                if (o is not None and not isinstance(o, (bool, int, float))
                        and not any(o is a for a in args)):
                    return None, None
                layout.append(("value", o, None))
                continue
            if o.device.type != "tpu":
                return None, None
            device = o.device
            meta = (tuple(o.shape), o.stride(), o.storage_offset())
            ptr = o.untyped_storage().data_ptr()
            if ptr in input_storage:
                layout.append(("input", input_storage[ptr], meta))
                continue
            if ptr in constants:
                layout.append(("value", o, None))
                continue
            j = new_storage.get(ptr)
            if j is None:
                nbytes = o.untyped_storage().nbytes()
                if nbytes % o.element_size():
                    return None, None
                j = new_storage[ptr] = len(out_storages)
                out_storages.append((nbytes // o.element_size(), o.dtype))
                reps.append(o)
            elif out_storages[j][1] != o.dtype:
                return None, None  # one storage read as two element types
            layout.append(("out", j, meta))
        return (layout, out_storages, type(outs), device), reps


def _block_mask_inputs(gm) -> list:
    """Positions among the graph's inputs of the block-list tensors (kv_num_blocks,
    kv_indices and their full_ twins) of its flex_attention (and backward) nodes."""
    graph = getattr(gm, "graph", None)
    if graph is None:  # a plain callable (a serving step's runner), not an FX graph
        return []
    hops = torch.ops.higher_order
    mask_arg = {getattr(hops, "flex_attention", None): 4,
                getattr(hops, "flex_attention_backward", None): 9}
    placeholders = {n: i for i, n in enumerate(n for n in graph.nodes if n.op == "placeholder")}
    found = set()
    for node in graph.nodes:
        where = mask_arg.get(node.target) if node.op == "call_function" else None
        if where is None or len(node.args) <= where:
            continue
        for item in tuple(node.args[where])[2:6]:
            if isinstance(item, torch.fx.Node) and item in placeholders:
                found.add(placeholders[item])
    return sorted(found)


def _modes_that_see_ops() -> bool:
    """Whether a TorchDispatchMode that looks at the ops is on the stack: any user mode (SAC's,
    a FLOP counter, DebugMode) or infra mode (fake, proxy, functional), but not AOTAutograd's
    own check of custom ops' aliasing, which is on the stack for a compiled function's first
    call and looks at custom ops only (that call must capture the graph as usual)."""
    from torch._C import _get_dispatch_mode
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    check = _aot_custom_op_check()
    if any(not (check and isinstance(m, check)) for m in _get_current_dispatch_mode_stack()):
        return True
    keys = torch._C._TorchDispatchModeKey
    return any(_get_dispatch_mode(k) is not None for k in (keys.FAKE, keys.PROXY, keys.FUNCTIONAL))


@functools.lru_cache(maxsize=1)
def _aot_custom_op_check():
    try:
        from torch._functorch._aot_autograd.runtime_wrappers import (
            _AnalyzeCustomOpInputOutputMode)
        return _AnalyzeCustomOpInputOutputMode
    except ImportError:  # another torch release: no such check to tell apart
        return None


def _as_compiled_region(runner: GraphRunner, args):
    """The call as one ``inductor_compiled_code`` op (option ``wrap_compiled_regions``, which
    the no-backend route sets from Inductor's ``wrap_inductor_compiled_regions``): what
    Inductor does with its own compiled code under a TorchDispatchMode, so that the mode sees
    the compiled graph as a single op instead of the ops the graph runs (or, replayed as a
    plan, does not run). Selective activation checkpointing depends on it: it records every op
    of a checkpointed region in the forward and expects the same ops, in the same order, when
    the region is recomputed in the backward, where a first-call capture and a later plan
    replay of the same graph run different ops; with the region one op, its output is saved
    or recomputed whole (torchtitan saves it, listing ``inductor_compiled_code``)."""
    from torch._higher_order_ops.wrap import InductorCompiledCallable, inductor_compiled_code

    region = runner.__dict__.get("_region")
    if region is None:
        _region_falls_through_autograd()
        region = runner._region = InductorCompiledCallable(
            lambda inputs: runner._call(tuple(inputs)), runner.gm, compile_region_name=runner.name)
    return inductor_compiled_code(region, list(args))


@functools.lru_cache(maxsize=1)
def _region_falls_through_autograd() -> None:
    # as PyTorch registers for CPU and CUDA: the op is not differentiated itself (the compiled
    # forward and backward are AOTAutograd's), so autograd passes it through
    from torch._higher_order_ops.wrap import inductor_compiled_code

    inductor_compiled_code.fallthrough(torch._C.DispatchKey.AutogradPrivateUse1)
