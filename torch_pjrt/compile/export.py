"""``export_stablehlo``: a ``torch.export`` ExportedProgram as one StableHLO program on the tpu
device.

Pipeline: ``exported_program.run_decompositions()`` (the functional core-ATen graph, see below)
-> every ``device=cpu`` argument in the graph (factory ops traced on CPU: ``arange``, ``full``,
``scalar_tensor``, ...) becomes the tpu device -> the graph runs once under a capture of the
recorder that the defer_and_fuse mode uses (the same machinery as ``torch.compile(backend="tpu")``,
graph_runner.py), over tpu copies of the weights (parameters, buffers, lifted constant tensors)
and zero-filled tpu placeholders of the user inputs -> the captured plan is the exported
program: its text is ``StableHLOModule.text`` and ``StableHLOModule.run`` executes it through
the PJRT runtime (one program execution per call, nothing dispatched or lowered again).

Why ``run_decompositions()``: ``torch.export.export`` returns the non-functional training IR
(composite ops such as ``linear``, and in-place mutations of buffers and inputs written as
in-place ops, e.g. ``aten.add_`` on a buffer with no output for it). Decomposing gives the
functional core-ATen graph, in which every buffer or input mutation is an explicit graph output
(``OutputKind.BUFFER_MUTATION`` / ``USER_INPUT_MUTATION``), so the captured program never
writes its inputs: weights stay read-only parameters and every result is a fresh output. A
program that is already core ATen is decomposed again at no semantic cost.

What the text is (both modes produce the same text; the capture machinery decides it):

- ``func.func @main(...)``, one function (bare: no ``module {}`` around it, as the runtime
  compiles it). Its arguments are, in this order: (1) every storage the
  graph reads before writing it, as a FLAT 1-D tensor of the storage's element count
  (``tensor<2048xf32>`` for a 64x32 weight), in the order the graph first touches the storages
  (not the ExportedProgram's input order); (2) scalar arguments: normally none, since a
  captured graph's Python numbers (``addmm``'s alpha/beta, ``mul``'s 0.5, fill values) are
  ``stablehlo.constant`` values in the text; only a complex scalar with an imaginary part stays
  an argument (``tensor<complex<f64>>``), in op order. ``StableHLOModule.inputs`` says which
  argument is which; it is read from the captured plan itself (``params()``: the plan input or
  plan constant behind each storage argument; ``results()``: where each result goes;
  ``scalars()``: the scalar arguments' values), so programs of any size are described.
- The storages of (1) are: the user inputs; the weights the graph reads (weights it does not
  read are not arguments: ``StableHLOModule.unused``); and "capture constants": storages
  created inside the graph by an op that writes them in place (``full``, ``scalar_tensor``,
  ``full_like``... lower to ``fill_`` on a fresh tensor, and an in-place op counts as reading
  its target). A capture constant is also a result (``tf.aliasing_output``): the program
  rewrites it every run.
- Results: flat 1-D storages, in graph-storage order: the outputs' storages (several outputs
  may be views of one result) and the written capture constants. ``StableHLOModule.outputs``
  gives each output's shape, strides and offset within its result.
- Scalar arguments, if any, are recorded at capture and passed by the plan at every run;
  each scalar ``ProgramInput`` carries its ``value``, so the text, ``inputs`` and the weights
  (``StableHLOModule.weights``, by ``target``) describe every argument but the capture
  constants: the plan holds their storages and does not expose their contents. A fill writes
  its target without reading it (the tiny GPT's text never reads its capture-constant
  arguments), but a program with an in-place op that reads a fresh tensor would need them.

``weights=``:

- ``"arguments"``: the weights are arguments of the plan: ``StableHLOModule`` holds tpu copies
  and passes them (and the user inputs) on every run; ``run(..., weights={name: tensor})``
  replaces some of them for one call (same shape and dtype).
- ``"constants"``: the plan holds the weights as its own constants (the capture is ended with
  only the user inputs as inputs, so every other storage the graph reads becomes a constant of
  the plan) and passes them implicitly; ``run`` takes only the user inputs. The weights are NOT
  baked into the text as ``stablehlo.constant`` values: the capture machinery makes every
  storage a program read an argument of the program, so the text still has one argument per
  weight the graph reads, exactly as in ``"arguments"`` mode (``inputs[i].source == "plan"``
  for them). Only the plan's calling convention differs. A plan reports its constants only as
  constants (``params()`` gives -1, not which weight), so this mode captures the graph twice:
  first with every tensor an input (which names the weight behind each argument), then with
  only the user inputs (the plan that runs); the two programs must be the same text.

Not supported (``NotImplementedError``): random ops (a captured plan takes their generator seed
and base offset as two program arguments drawn from the tpu generator on every run, and
``inputs`` has no kind to describe those two arguments to a caller of the text yet), dynamic
shapes (the program is static-shaped), custom-object and token inputs, and graphs whose capture
breaks (a host read, a CPU fallback, a data-dependent shape, an op on another device), which
cannot be one program.
"""
from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any, Mapping, Optional

import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import InputKind, OutputKind

from .. import modes
from ..device import _C
from .graph_runner import GraphRunner, _entry

__all__ = ["export_stablehlo", "StableHLOModule", "ProgramInput", "ProgramOutput"]

WEIGHT_MODES = ("arguments", "constants")

_WEIGHT_KINDS = {
    InputKind.PARAMETER: "parameter",
    InputKind.BUFFER: "buffer",
    InputKind.CONSTANT_TENSOR: "constant",
}

# MLIR element types of @main's arguments (csrc/runtime/dtype.c) -> torch dtypes
_TORCH_OF_MLIR = {
    "i1": torch.bool, "ui8": torch.uint8, "i8": torch.int8, "i16": torch.int16,
    "i32": torch.int32, "i64": torch.int64, "f16": torch.float16, "bf16": torch.bfloat16,
    "f32": torch.float32, "f64": torch.float64, "complex<f32>": torch.complex64,
    "complex<f64>": torch.complex128,
}


@dataclasses.dataclass(frozen=True)
class ProgramInput:
    """One argument of ``@main``.

    kind: ``"user_input"``, ``"parameter"``, ``"buffer"``, ``"constant"`` (a lifted constant
    tensor), ``"capture_constant"`` (a storage the plan holds that is no ExportedProgram input:
    one created inside the graph by an in-place fill, see the module docstring) or
    ``"scalar"`` (a recorded op's runtime scalar).
    source: who supplies it at run time: ``"caller"`` (``run``'s arguments), ``"module"`` (the
    weights a ``weights="arguments"`` module holds and passes) or ``"plan"`` (held by the
    captured plan and passed implicitly).
    name/target: the ExportedProgram's placeholder name and state-dict / constant key (None
    where there is none). shape: the PyTorch shape (None for capture constants); the argument
    itself is the flat storage (``mlir_type``). aliased_result: the ``@main`` result the
    argument's storage is updated from (``tf.aliasing_output``), or None. value: for a
    ``"scalar"``, the value recorded at capture that the plan passes at every run (a Python
    bool, int, float or complex); None otherwise.
    """

    index: int
    kind: str
    source: str
    name: Optional[str]
    target: Optional[str]
    shape: Optional[tuple]
    dtype: torch.dtype
    mlir_type: str
    aliased_result: Optional[int] = None
    value: Any = None


@dataclasses.dataclass(frozen=True)
class ProgramOutput:
    """One output of the ExportedProgram's graph, in graph order.

    kind: ``"user_output"``, ``"loss_output"``, ``"buffer_mutation"`` (the buffer's new value;
    ``run`` writes it into the buffer) or ``"user_input_mutation"`` (``run`` writes it into the
    caller's tensor). result: the ``@main`` result holding its storage (the tensor is the view
    ``shape``/``stride``/``storage_offset`` of that flat result), or None when it is a view of an
    input (``aliases_input``, a name) or not a tensor (``value``).
    """

    index: int
    kind: str
    name: str
    target: Optional[str]
    shape: Optional[tuple]
    dtype: Optional[torch.dtype]
    stride: Optional[tuple]
    storage_offset: Optional[int]
    result: Optional[int]
    aliases_input: Optional[str] = None
    value: Any = None


class StableHLOModule:
    """The exported program (made by ``export_stablehlo``; see the module docstring of
    torch_pjrt/compile/export.py for what the text contains in each weights mode).

    Attributes: ``text`` (StableHLO, ``func.func @main``), ``inputs`` (``ProgramInput`` per
    ``@main`` argument, in order), ``outputs`` (``ProgramOutput`` per graph output, in order),
    ``unused`` (placeholder names of ExportedProgram inputs the program does not read),
    ``weights_mode``, ``device``, ``weights`` (``{target: tpu tensor}``: the weights as exported,
    the module's buffers as updated by runs), ``stats`` (the plan's op, parameter, result and
    scalar counts), ``exported_program`` (the decomposed ExportedProgram that was captured).
    ``scalars`` lists the scalar arguments' values in argument order (``inputs[i].value`` of the
    ``"scalar"`` inputs).
    """

    def __init__(self, **kw):
        self.__dict__.update(kw)

    # -- description ---------------------------------------------------------------------

    @property
    def user_inputs(self) -> list[ProgramInput]:
        return [i for i in self.inputs if i.kind == "user_input"]

    @property
    def weight_inputs(self) -> list[ProgramInput]:
        return [i for i in self.inputs if i.kind in ("parameter", "buffer", "constant")]

    @property
    def scalars(self) -> list:
        return [i.value for i in self.inputs if i.kind == "scalar"]

    def __repr__(self) -> str:
        kinds: dict[str, int] = {}
        for i in self.inputs:
            kinds[i.kind] = kinds.get(i.kind, 0) + 1
        outs = [o.shape for o in self.outputs if o.kind in ("user_output", "loss_output")]
        return (f"StableHLOModule(weights={self.weights_mode!r}, @main arguments: "
                f"{', '.join(f'{n} {k}' for k, n in kinds.items())}; outputs {outs})")

    # -- running -------------------------------------------------------------------------

    def run(self, *args, weights: Optional[Mapping[str, torch.Tensor]] = None, **kwargs):
        """Executes the exported program (the captured plan: one program execution) on the
        user inputs, given as the exported module's forward was called (positional and
        keyword). Tensors may be on any device; they must have the exported shapes and dtypes.
        Returns the user outputs as tpu tensors, structured as the module's forward returns
        them. Buffer mutations are written into the module's buffers (or the tensors given in
        ``weights``), user-input mutations into the caller's tensors.

        ``weights`` (``weights="arguments"`` only): ``{target: tensor}`` replacing held weights
        (by state-dict / constant key) for this call."""
        flat, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        if spec != self._in_spec:
            raise TypeError(f"run(): the inputs are structured as {spec}, the exported program "
                            f"takes {self._in_spec}")
        if weights and self.weights_mode != "arguments":
            raise ValueError("run(weights=...) needs weights='arguments': with weights='constants' "
                             "the weights are constants of the captured plan")
        full = list(self._held)        # per ExportedProgram input (spec order), tpu tensors
        originals = list(self._held)   # what a mutation is written back into
        seen: set[int] = set()
        for pos, value in zip(self._user_positions, flat):
            spec_i = self._input_specs[pos]
            if self._const_user[pos] is not _NO_CONST:
                if value != self._const_user[pos]:
                    raise ValueError(f"run(): input {spec_i.arg.name!r} was exported as the "
                                     f"constant {self._const_user[pos]!r}, got {value!r}")
                continue
            full[pos] = self._prepare(value, pos, seen, what=f"input {spec_i.arg.name!r}")
            originals[pos] = value
        if weights:
            by_target = {self._input_specs[p].target: p for p in self._weight_positions}
            for target, value in weights.items():
                if target not in by_target:
                    raise KeyError(f"run(weights=...): {target!r} is not a weight of the exported "
                                   f"program; weights: {sorted(by_target)}")
                pos = by_target[target]
                full[pos] = self._prepare(value, pos, seen, what=f"weight {target!r}")
                originals[pos] = value
        for pos in self._weight_positions:  # a held weight must not alias a given tensor
            if weights and self._input_specs[pos].target in weights:
                continue
            ptr = full[pos].untyped_storage().data_ptr()
            if ptr in seen:
                full[pos] = full[pos].clone()
            seen.add(ptr)
        if self.weights_mode == "arguments":
            plan_inputs = [t for t in full if isinstance(t, torch.Tensor)]
        else:
            plan_inputs = [full[p] for p in self._user_positions
                           if self._const_user[p] is _NO_CONST]
        outs = self._entry.run(full, plan_inputs)
        user = []
        for o, spec_o in zip(outs, self._output_specs):
            if spec_o.kind == OutputKind.BUFFER_MUTATION:
                pos = self._position_of_target[spec_o.target]
                with torch.no_grad():
                    originals[pos].copy_(o)
            elif spec_o.kind == OutputKind.USER_INPUT_MUTATION:
                pos = self._position_of_name[spec_o.target]
                with torch.no_grad():
                    originals[pos].copy_(o)
            else:
                user.append(o)
        return pytree.tree_unflatten(user, self._out_spec)

    __call__ = run

    def _prepare(self, value, pos, seen, what):
        """``value`` as a tpu tensor with its own exactly-sized storage (the plan checks every
        storage's size and that distinct storages at capture are distinct now)."""
        want = self._held[pos]
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"run(): {what} must be a tensor, got {type(value).__name__}")
        if tuple(value.shape) != tuple(want.shape) or value.dtype != want.dtype:
            raise ValueError(f"run(): {what} has shape {tuple(value.shape)} and dtype "
                             f"{value.dtype}; the program was exported for shape "
                             f"{tuple(want.shape)} and dtype {want.dtype}")
        t = value.detach().to(self.device)
        if not _exact(t) or t.untyped_storage().data_ptr() in seen:
            t = t.clone(memory_format=torch.contiguous_format)
        seen.add(t.untyped_storage().data_ptr())
        return t


_NO_CONST = object()


def _exact(t: torch.Tensor) -> bool:
    return (t.is_contiguous() and t.storage_offset() == 0
            and t.untyped_storage().nbytes() == t.numel() * t.element_size())


def _on_tpu(value, device):
    if isinstance(value, torch.device) and value.type == "cpu":
        return device
    return value


def _graph_on_device(gm: torch.fx.GraphModule, device: torch.device) -> torch.fx.GraphModule:
    """A copy of ``gm`` whose ``device=cpu`` arguments (factory ops traced on CPU) are
    ``device``."""
    graph = copy.deepcopy(gm.graph)
    for node in graph.nodes:
        node.args = pytree.tree_map(lambda v: _on_tpu(v, device), node.args)
        node.kwargs = pytree.tree_map(lambda v: _on_tpu(v, device), node.kwargs)
    return torch.fx.GraphModule(gm, graph)


def _random_ops(gm: torch.fx.GraphModule) -> list[str]:
    return sorted({str(n.target) for n in gm.graph.nodes
                   if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                   and torch.Tag.nondeterministic_seeded in n.target.tags})


# ---- the text's signature ------------------------------------------------------------------


def _split_top(s: str) -> list[str]:
    """``s`` split at the commas outside <>, (), {} and []."""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "<({[":
            depth += 1
        elif ch in ">)}]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def _main_signature(text: str):
    """``@main``'s arguments [(mlir_type, aliased result or None)] and result types."""
    start = text.find("func.func @main(")
    if start < 0:
        raise RuntimeError("export_stablehlo: the plan's text has no func.func @main")
    i, depth = start + len("func.func @main("), 1
    j = i
    while depth:
        depth += {"(": 1, ")": -1}.get(text[j], 0)
        j += 1
    args = []
    for a in _split_top(text[i:j - 1]):
        m = re.match(r"%[\w.$-]+\s*:\s*(.*?)\s*(\{(.*)\})?$", a, re.S)
        if not m:
            raise RuntimeError(f"export_stablehlo: cannot parse @main argument {a!r}")
        alias = re.search(r"tf\.aliasing_output\s*=\s*(\d+)", m.group(3) or "")
        args.append((m.group(1).strip(), int(alias.group(1)) if alias else None))
    rest = text[j:].lstrip()
    results: list[str] = []
    if rest.startswith("->"):
        rest = rest[2:].lstrip()
        if rest.startswith("("):
            k, depth = 1, 1
            while depth:
                depth += {"(": 1, ")": -1}.get(rest[k], 0)
                k += 1
            results = _split_top(rest[1:k - 1])
        else:
            results = [rest.split("{", 1)[0].strip()]
    return args, results


def _tensor_type(mlir_type: str):
    """(element type, element count or None for 0-d) of ``tensor<...>``."""
    m = re.fullmatch(r"tensor<(.*)>", mlir_type.strip())
    if not m:
        return None, None
    body = m.group(1)
    dims = re.match(r"((?:\d+x)*)(.*)", body)
    shape = [int(d) for d in dims.group(1).split("x") if d]
    count = 1
    for d in shape:
        count *= d
    return dims.group(2), (count if shape else None)


def _capture(gm: torch.fx.GraphModule, held: list, plan_inputs: list[torch.Tensor]):
    """Runs ``gm`` on ``held`` once under a capture ended with ``plan_inputs`` as the plan's
    inputs: (outputs, the graph's per-call entry, its output layout (see GraphRunner._describe),
    output storage tensors, plan)."""
    with torch.no_grad(), modes.eager_mode("defer_and_fuse"):
        _C._capture_begin()
        try:
            outs = gm(*held)
        except BaseException:
            _C._capture_abort()
            raise
        desc, reps = GraphRunner._describe(outs, held, plan_inputs)
        if desc is None:
            _C._capture_abort()
            raise NotImplementedError(
                "export_stablehlo: the program's outputs cannot be rebuilt from one program's "
                "results (an output that is not a tpu tensor or a plain value, or one storage "
                "read as two element types)")
        plan = _C._capture_end(plan_inputs, reps)
    if plan is None:
        raise NotImplementedError(
            "export_stablehlo: the graph could not be captured as one program: something forced "
            "the recorded ops to run during the capture (a read to the host, a CPU fallback, a "
            "data-dependent shape, an op on another device, or a storage used with two element "
            "types). torch_pjrt.modes.pending_graph() and torch.tpu.fallback_ops() help find it.")
    return outs, _entry(plan, *desc), desc[0], reps, plan


# ---- export --------------------------------------------------------------------------------


def export_stablehlo(exported_program: "torch.export.ExportedProgram",
                     weights: str = "arguments", device: Any = "tpu") -> StableHLOModule:
    """The ExportedProgram (``torch.export.export(model, args)``) as one StableHLO program on the
    tpu device. Returns a ``StableHLOModule``:

    - ``text``: the StableHLO text (``func.func @main``) of the whole program;
    - ``inputs``: ``@main``'s arguments in order (``ProgramInput``: user inputs, weights,
      capture constants, scalars; their shapes, dtypes, and who supplies each);
    - ``outputs``: the graph's outputs (``ProgramOutput``: shapes, dtypes, which result);
    - ``unused``: ExportedProgram inputs the program does not read;
    - ``run(*args, **kwargs)``: executes the program (the captured plan) and returns the outputs.

    ``weights``: ``"arguments"`` or ``"constants"``; the module docstring
    (torch_pjrt/compile/export.py) says exactly what the text and ``run`` are in each mode. The
    weights are copied to the device at export; later changes to the model do not reach the
    exported program.
    """
    if weights not in WEIGHT_MODES:
        raise ValueError(f"export_stablehlo: weights must be one of {WEIGHT_MODES}, "
                         f"got {weights!r}")
    if not isinstance(exported_program, torch.export.ExportedProgram):
        raise TypeError("export_stablehlo takes the result of torch.export.export(model, args), "
                        f"got {type(exported_program).__name__}")
    device = torch.device(device)
    if device.type != "tpu":
        raise ValueError(f"export_stablehlo: device must be a tpu device, got {device}")
    if device.index is None:
        device = torch.device("tpu", torch.tpu.current_device())

    ep = exported_program.run_decompositions()
    randoms = _random_ops(ep.graph_module)
    if randoms:
        raise NotImplementedError(
            "export_stablehlo: the program has random ops (" + ", ".join(randoms) + "). Their "
            "generator seed and offset would be two program arguments drawn from the tpu "
            "generator on every run, which the exported module's inputs cannot describe yet; "
            "export the model in eval mode (dropout is then removed) or without random ops.")
    sig = ep.graph_signature
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    specs = list(sig.input_specs)
    if len(placeholders) != len(specs):
        raise RuntimeError("export_stablehlo: the graph's placeholders do not match its signature")

    held: list[Any] = []
    const_user: list[Any] = []
    user_positions, weight_positions = [], []
    for pos, (node, spec) in enumerate(zip(placeholders, specs)):
        const_user.append(_NO_CONST)
        if spec.kind == InputKind.USER_INPUT:
            user_positions.append(pos)
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                shape = tuple(val.shape)
                if not all(isinstance(d, int) for d in shape):
                    raise NotImplementedError(
                        f"export_stablehlo: input {spec.arg.name!r} has the symbolic shape "
                        f"{tuple(val.shape)}; the exported StableHLO program is static-shaped "
                        "(export without dynamic_shapes)")
                held.append(torch.zeros(shape, dtype=val.dtype, device=device))
            else:  # a non-tensor input the export specialized on
                value = getattr(spec.arg, "value", val)
                if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                    raise NotImplementedError(
                        f"export_stablehlo: input {spec.arg.name!r} is symbolic; the exported "
                        "StableHLO program is static-shaped")
                const_user[pos] = value
                held.append(value)
        elif spec.kind in _WEIGHT_KINDS:
            weight_positions.append(pos)
            if spec.kind == InputKind.CONSTANT_TENSOR or (
                    spec.kind == InputKind.BUFFER and spec.target not in ep.state_dict):
                value = ep.constants[spec.target]
            else:
                value = ep.state_dict[spec.target]
            if not isinstance(value, torch.Tensor):
                raise NotImplementedError(f"export_stablehlo: {spec.target!r} is not a tensor")
            t = value.detach().to(device)
            shared = value.device == t.device  # already on the device: .to() returned it
            if shared or not _exact(t):
                t = t.clone(memory_format=torch.contiguous_format)  # the module's own copy
            held.append(t)
        else:
            raise NotImplementedError(f"export_stablehlo: inputs of kind {spec.kind.name} "
                                      f"({spec.arg.name!r}) are not supported")
    for spec in sig.output_specs:
        if spec.kind not in (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT,
                             OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION):
            raise NotImplementedError(f"export_stablehlo: outputs of kind {spec.kind.name} "
                                      f"({spec.arg.name!r}) are not supported")

    gm = _graph_on_device(ep.graph_module, device)
    tensor_pos = [p for p, t in enumerate(held) if isinstance(t, torch.Tensor)]
    tensors = [held[p] for p in tensor_pos]
    # every tensor an input of the plan: params() names the ExportedProgram input behind each
    # storage argument (-1: a capture constant)
    outs, entry, layout, reps, plan = _capture(gm, held, tensors)
    text = plan.text()
    sources = [tensor_pos[k] if k >= 0 else None for k in plan.params()]
    if weights == "constants" and weight_positions:
        # the plan that runs: only the user inputs are inputs, the weights become its constants
        user = {p: k for k, p in enumerate(p for p in user_positions
                                            if const_user[p] is _NO_CONST)}
        del outs, reps, plan
        outs, entry, layout, reps, plan = _capture(gm, held, [held[p] for p in user])
        expect = [user.get(p, -1) for p in sources]
        if plan.text() != text or plan.params() != expect:
            raise RuntimeError("export_stablehlo: capturing the graph with the weights as plan "
                               "constants gave a different program than with the weights as "
                               "inputs, so its arguments cannot be described")
    params, results, scalars, stats = plan.params(), plan.results(), plan.scalars(), plan.stats()

    # -- which @main argument / result is which (from the plan, checked against the text) --
    args, result_types = _main_signature(text)
    nparams = stats["params"]
    if (len(params) != nparams or len(scalars) != stats["scalars"]
            or len(args) != nparams + len(scalars) or len(results) != stats["results"]
            or len(result_types) != len(results)):
        raise RuntimeError(f"export_stablehlo: @main has {len(args)} arguments and "
                           f"{len(result_types)} results; the plan reports {stats}, "
                           f"{len(params)} parameters, {len(results)} results and "
                           f"{len(scalars)} scalars")

    names = [n.name for n in placeholders]
    inputs: list[ProgramInput] = []
    used = set()
    for a, (mlir_type, alias) in enumerate(args):
        et, count = _tensor_type(mlir_type)
        dtype = _TORCH_OF_MLIR.get(et)
        if a >= nparams:
            inputs.append(ProgramInput(a, "scalar", "plan", None, None, (), dtype, mlir_type,
                                       alias, value=scalars[a - nparams]))
            continue
        if alias is not None and (alias >= len(results) or results[alias] != params[a]):
            raise RuntimeError(f"export_stablehlo: @main argument {a} aliases result {alias}, "
                               "which the plan does not write back into it")
        pos = sources[a]
        if pos is None:
            inputs.append(ProgramInput(a, "capture_constant", "plan", None, None, None, dtype,
                                       mlir_type, alias))
            continue
        t = held[pos]
        numel = 1 if count is None else count
        if dtype is not None and numel * dtype.itemsize != t.untyped_storage().nbytes():
            raise RuntimeError(f"export_stablehlo: @main argument {a} ({mlir_type}) is not the "
                               f"storage of input {names[pos]!r} ({t.untyped_storage().nbytes()} "
                               "bytes)")
        used.add(pos)
        spec = specs[pos]
        if spec.kind == InputKind.USER_INPUT:
            kind, source, target = "user_input", "caller", None
        else:
            kind = _WEIGHT_KINDS[spec.kind]
            source = "module" if weights == "arguments" else "plan"
            target = spec.target
        inputs.append(ProgramInput(a, kind, source, names[pos], target, tuple(t.shape), t.dtype,
                                   mlir_type, alias))
    unused = [names[p] for p in tensor_pos if p not in used]

    result_of_rep = {-2 - r: q for q, r in enumerate(results) if r <= -2}
    if sorted(result_of_rep) != list(range(len(reps))):
        raise RuntimeError(f"export_stablehlo: the plan's results {results} do not account for "
                           f"the {len(reps)} output storages")
    outputs: list[ProgramOutput] = []
    for i, ((kind, where, meta), spec) in enumerate(zip(layout, sig.output_specs)):
        okind = {OutputKind.USER_OUTPUT: "user_output", OutputKind.LOSS_OUTPUT: "loss_output",
                 OutputKind.BUFFER_MUTATION: "buffer_mutation",
                 OutputKind.USER_INPUT_MUTATION: "user_input_mutation"}[spec.kind]
        target = getattr(spec, "target", None)
        if kind == "value":
            outputs.append(ProgramOutput(i, okind, spec.arg.name, target, None, None, None, None,
                                         None, value=where))
            continue
        shape, stride, offset = meta
        outputs.append(ProgramOutput(
            i, okind, spec.arg.name, target, tuple(shape), outs[i].dtype, tuple(stride), offset,
            result_of_rep[where] if kind == "out" else None,
            aliases_input=names[where] if kind == "input" else None))

    module = StableHLOModule(
        text=text,
        inputs=inputs,
        outputs=outputs,
        unused=unused,
        weights_mode=weights,
        device=device,
        exported_program=ep,
        stats=stats,
        weights={specs[p].target: held[p] for p in weight_positions},
        _entry=entry,
        _held=held,
        _input_specs=specs,
        _output_specs=list(sig.output_specs),
        _user_positions=user_positions,
        _weight_positions=weight_positions,
        _const_user=const_user,
        _in_spec=ep.call_spec.in_spec,
        _out_spec=ep.call_spec.out_spec,
        _position_of_target={specs[p].target: p for p in weight_positions},
        _position_of_name={names[p]: p for p in user_positions},
    )
    return module

