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
``StableHLOModule.run_text`` compiles the text itself (``text``, not the plan) with the runtime and
executes it on host copies of the arguments, which shows the text alone computes the program.

Why ``run_decompositions()``: ``torch.export.export`` returns the non-functional training IR
(composite ops such as ``linear``, and in-place mutations of buffers and inputs written as
in-place ops, e.g. ``aten.add_`` on a buffer with no output for it). Decomposing gives the
functional core-ATen graph, in which every buffer or input mutation is an explicit graph output
(``OutputKind.BUFFER_MUTATION`` / ``USER_INPUT_MUTATION``), so the captured program never
writes its inputs: weights stay read-only parameters and every result is a fresh output. A
program that is already core ATen is decomposed again at no semantic cost.

What the plan's text is (the capture machinery decides it; it is ``text`` in the
``"arguments"`` and ``"constants"`` modes, and ``plan_text`` in every mode):

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
  baked into the text as ``stablehlo.constant`` values (``"inline"`` does that, from this same
  plan's text): the capture machinery makes every storage a program reads an argument of the
  program, so the text still has one argument per
  weight the graph reads, exactly as in ``"arguments"`` mode (``inputs[i].source == "plan"``
  for them). Only the plan's calling convention differs. A plan reports its constants only as
  constants (``params()`` gives -1, not which weight), so this mode captures the graph twice:
  first with every tensor an input (which names the weight behind each argument), then with
  only the user inputs (the plan that runs); the two programs must be the same text.
- ``"inline"``: a self-contained text. The plan is captured as in ``"constants"`` mode (the
  weights are its constants; ``run`` takes only the user inputs; the exception below is a plan
  input), and ``text`` is its text with every weight argument (and every scalar argument)
  removed from ``@main``'s signature and defined, under the same SSA name, at the top of the
  body as a constant holding the exact bytes the plan passes (the weights' CPU
  values): ``%v0 = "stablehlo.constant"() {value = dense<"0x0000803F..."> : tensor<64xf32>} :
  () -> tensor<64xf32>``. The hex literal is the flat storage's little-endian element bytes
  (``f32``, ``bf16``, ``f16``, ``i64``, ``ui8``, complex: real then imaginary part ...); an
  ``i1`` storage is written as ``dense<[true, false, ...]>`` instead, because MLIR versions
  disagree on the hex layout of ``i1`` (bit-packed in older ones, one byte per element in
  newer). ``text``'s arguments are then only the user inputs and the capture constants (the
  remaining arguments keep their attributes: ``tf.aliasing_output`` names a result, and the
  results are unchanged), plus one exception: a buffer the program mutates
  (``OutputKind.BUFFER_MUTATION``) stays an argument (``source == "module"``; it is a plan
  input too), since a constant could not see its updates. ``inputs`` describes ``text``'s
  arguments (renumbered), ``inlined`` the removed ones (``source == "text"``, ``index`` their
  position in ``plan_text``), ``outputs`` is unchanged. ``stats`` counts the plan's arguments.

Running the text (``run_text``, every mode): ``text`` is compiled once (cached on the module)
with the runtime's ``pj_program_compile`` and executed with ``pj_program_execute`` on buffers
uploaded from host copies of: the user inputs, the held weights that are still arguments, and
zeros for the capture constants (refused, ``NotImplementedError``, if the text reads one: its
contents are the plan's); the results are downloaded and the outputs rebuilt from ``outputs``
as CPU tensors. Buffer and user-input mutations are written back as ``run`` does. The runtime
entry points are the C ABI of the extension library (``torch_pjrt._C``), called with ``ctypes``:
the Python bindings have no text-compiling function.

Not supported (``NotImplementedError``): random ops (a captured plan takes their generator seed
and base offset as two program arguments drawn from the tpu generator on every run, and
``inputs`` has no kind to describe those two arguments to a caller of the text yet), dynamic
shapes (the program is static-shaped), custom-object and token inputs, and graphs whose capture
breaks (a host read, a CPU fallback, a data-dependent shape, an op on another device), which
cannot be one program.
"""
from __future__ import annotations

import copy
import ctypes
import dataclasses
import re
import sys
from typing import Any, Mapping, Optional

import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import InputKind, OutputKind

from .. import modes
from ..device import _C
from .graph_runner import GraphRunner, _entry

__all__ = ["export_stablehlo", "StableHLOModule", "ProgramInput", "ProgramOutput"]

WEIGHT_MODES = ("arguments", "constants", "inline")

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
    weights a ``weights="arguments"`` module holds and passes, and in ``weights="inline"``
    the buffers the program mutates), ``"plan"`` (held by the captured plan and passed
    implicitly) or ``"text"`` (``StableHLOModule.inlined`` only: a constant of ``text``, no
    longer an argument).
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
    ``"scalar"`` inputs). ``plan_text``: the captured plan's own text (the same as ``text``
    except in ``weights="inline"``, where ``text`` has the weights inlined as constants and
    ``inlined`` describes the ``plan_text`` arguments that became constants; ``[]`` otherwise).
    ``run`` executes the plan, ``run_text`` the text.
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
            raise ValueError("run(weights=...) needs weights='arguments': with weights="
                             f"{self.weights_mode!r} the weights are constants of the captured "
                             "plan")
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
        plan_inputs = [full[p] for p in self._plan_positions]
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

    def run_text(self, *args, **kwargs):
        """Executes ``text`` itself (not the captured plan): the text is compiled once by the
        PJRT runtime (cached on the module) and run on buffers uploaded from host copies of its
        arguments, as ``inputs`` describes them: the user inputs (given as for ``run``), the
        held weights that are arguments (``source == "module"`` / ``"plan"``), zeros for the
        capture constants (``NotImplementedError`` if the text reads one) and the recorded
        scalars. Returns the user outputs as CPU tensors, structured as ``run`` returns them;
        buffer mutations are written into the module's buffers, user-input mutations into the
        caller's tensors, as ``run`` does."""
        flat, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        if spec != self._in_spec:
            raise TypeError(f"run_text(): the inputs are structured as {spec}, the exported "
                            f"program takes {self._in_spec}")
        given: dict[int, torch.Tensor] = {}
        for pos, value in zip(self._user_positions, flat):
            what = f"input {self._input_specs[pos].arg.name!r}"
            if self._const_user[pos] is not _NO_CONST:
                if value != self._const_user[pos]:
                    raise ValueError(f"run_text(): {what} was exported as the constant "
                                     f"{self._const_user[pos]!r}, got {value!r}")
                continue
            self._check(value, pos, what)
            given[pos] = value
        host = {pos: _host_flat(t) for pos, t in given.items()}
        for pos in self._weight_positions:
            host[pos] = _host_flat(self._held[pos])
        names = [s.arg.name for s in self._input_specs]
        program = self._text_program()
        arguments = []
        for i in self.inputs:
            _, count = _tensor_type(i.mlir_type)
            if i.kind == "capture_constant":
                if program.reads(i.index):
                    raise NotImplementedError(
                        f"run_text(): the text reads @main argument {i.index}, a capture "
                        "constant whose contents only the captured plan holds; use run()")
                arguments.append(torch.zeros(1 if count is None else count, dtype=i.dtype))
            elif i.kind == "scalar":
                arguments.append(torch.tensor(i.value, dtype=i.dtype))
            else:
                arguments.append(host[names.index(i.name)])
        results = program(arguments)
        user = []
        for o, spec_o in zip(self.outputs, self._output_specs):
            if o.result is not None:
                value = results[o.result].as_strided(o.shape, o.stride, o.storage_offset)
            elif o.aliases_input is not None:
                base = host[names.index(o.aliases_input)]
                value = base.as_strided(o.shape, o.stride, o.storage_offset)
            else:
                value = o.value
            if spec_o.kind == OutputKind.BUFFER_MUTATION:
                with torch.no_grad():
                    self._held[self._position_of_target[spec_o.target]].copy_(value)
            elif spec_o.kind == OutputKind.USER_INPUT_MUTATION:
                with torch.no_grad():
                    given[self._position_of_name[spec_o.target]].copy_(value)
            else:
                user.append(value)
        return pytree.tree_unflatten(user, self._out_spec)

    def _text_program(self) -> "_TextProgram":
        if self._text_compiled is None or self._text_compiled.text is not self.text:
            self._text_compiled = _TextProgram(self.text, self.device.index)
        return self._text_compiled

    def _check(self, value, pos, what):
        want = self._held[pos]
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"run(): {what} must be a tensor, got {type(value).__name__}")
        if tuple(value.shape) != tuple(want.shape) or value.dtype != want.dtype:
            raise ValueError(f"run(): {what} has shape {tuple(value.shape)} and dtype "
                             f"{value.dtype}; the program was exported for shape "
                             f"{tuple(want.shape)} and dtype {want.dtype}")

    def _prepare(self, value, pos, seen, what):
        """``value`` as a tpu tensor with its own exactly-sized storage (the plan checks every
        storage's size and that distinct storages at capture are distinct now)."""
        self._check(value, pos, what)
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


@dataclasses.dataclass(frozen=True)
class _Argument:
    name: str               # SSA name, "%v0"
    mlir_type: str
    alias: Optional[int]    # tf.aliasing_output
    source: str             # the argument's text in the signature


def _main_parts(text: str):
    """@main's signature: (offset of its argument list, offset of the ``)`` closing it, the
    arguments [_Argument], the result types, offset just past the ``{`` opening the body)."""
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
        m = re.match(r"(%[\w.$-]+)\s*:\s*(.*?)\s*(\{(.*)\})?$", a, re.S)
        if not m:
            raise RuntimeError(f"export_stablehlo: cannot parse @main argument {a!r}")
        alias = re.search(r"tf\.aliasing_output\s*=\s*(\d+)", m.group(4) or "")
        args.append(_Argument(m.group(1), m.group(2).strip(),
                              int(alias.group(1)) if alias else None, a))
    k = j
    while text[k].isspace():
        k += 1
    results: list[str] = []
    if text.startswith("->", k):
        k += 2
        while text[k].isspace():
            k += 1
        if text[k] == "(":
            k0, depth = k + 1, 1
            k += 1
            while depth:
                depth += {"(": 1, ")": -1}.get(text[k], 0)
                k += 1
            results = _split_top(text[k0:k - 1])
        else:
            k0 = k
            k = text.index("{", k)
            results = [text[k0:k].strip()]
    body = text.index("{", k) + 1
    return i, j - 1, args, results, body


def _main_signature(text: str):
    """``@main``'s arguments [(mlir_type, aliased result or None)] and result types."""
    _, _, args, results, _ = _main_parts(text)
    return [(a.mlir_type, a.alias) for a in args], results


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


def _host_flat(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``t``'s elements, flat (the storage of an exactly-sized tensor)."""
    return t.detach().cpu().contiguous().reshape(-1)


def _dense_literal(value: torch.Tensor, mlir_type: str) -> str:
    """The ``dense<...>`` literal of ``mlir_type`` (a flat ``tensor<Nx..>`` or a 0-d
    ``tensor<..>``) holding ``value``'s elements: hex of their little-endian bytes, or, for
    ``i1``, a list of true/false (MLIR versions disagree on i1's hex layout)."""
    et, count = _tensor_type(mlir_type)
    dtype = _TORCH_OF_MLIR.get(et)
    if dtype is None:
        raise NotImplementedError(f"export_stablehlo: cannot write a {mlir_type} constant")
    numel = 1 if count is None else count
    flat = _host_flat(value)
    if flat.numel() * flat.element_size() != numel * dtype.itemsize:
        raise RuntimeError(f"export_stablehlo: {flat.numel()} elements of {flat.dtype} are not "
                           f"a {mlir_type} value")
    raw = flat.view(torch.uint8)
    if et == "i1":
        bits = ["true" if b else "false" for b in raw.ne(0).tolist()]
        return f"dense<{bits[0]}>" if count is None else f"dense<[{', '.join(bits)}]>"
    if numel == 0:
        return "dense<[]>"
    if sys.byteorder != "little":
        raise NotImplementedError("export_stablehlo: weights='inline' writes little-endian bytes "
                                  "(MLIR's hex literal layout) and needs a little-endian host")
    return f'dense<"0x{raw.numpy().tobytes().hex().upper()}">'


def _inline_arguments(text: str, values: Mapping[int, torch.Tensor]) -> str:
    """``text`` with each ``@main`` argument ``a`` in ``values`` removed from the signature and
    defined, under its SSA name, at the top of the body as a ``stablehlo.constant`` of
    ``values[a]``. The other arguments keep their text (attributes included)."""
    i, j, args, _, body = _main_parts(text)
    if any(not 0 <= a < len(args) for a in values):
        raise IndexError(f"export_stablehlo: @main has {len(args)} arguments; cannot inline "
                         f"{sorted(values)}")
    consts = []
    for a in sorted(values):
        arg = args[a]
        if arg.alias is not None:
            raise RuntimeError(f"export_stablehlo: @main argument {a} is written back "
                               f"(tf.aliasing_output = {arg.alias}) and cannot be a constant")
        ty = arg.mlir_type
        consts.append(f'  {arg.name} = "stablehlo.constant"() '
                      f'{{value = {_dense_literal(values[a], ty)} : {ty}}} : () -> {ty}\n')
    kept = ", ".join(arg.source for a, arg in enumerate(args) if a not in values)
    nl = text.find("\n", body)
    nl = len(text) if nl < 0 else nl + 1
    return text[:i] + kept + text[j:nl] + "".join(consts) + text[nl:]


# ---- running a text through the runtime (the extension's C ABI, by ctypes) -----------------

_STATUS_ERRORS = {2: ValueError, 3: TypeError, 4: IndexError, 5: NotImplementedError,
                  6: torch.OutOfMemoryError}


class _DtypeInfo(ctypes.Structure):  # pj_dtype_info_t (csrc/include/torch_pjrt/dtype.h)
    _fields_ = [("name", ctypes.c_char_p), ("mlir", ctypes.c_char_p),
                ("itemsize", ctypes.c_size_t), ("pjrt_type", ctypes.c_int),
                ("is_float", ctypes.c_bool), ("is_complex", ctypes.c_bool),
                ("is_signed", ctypes.c_bool), ("is_lowp", ctypes.c_bool)]


_RUNTIME: list = []  # [(library, {torch dtype: pj_dtype_t})], loaded once


def _runtime():
    """The extension library (already loaded: dlopen returns the same handle, so this is the
    process's runtime and PJRT client) with the C signatures declared, and the runtime's dtype
    numbering (read from its own table, checked against ``_TORCH_OF_MLIR``)."""
    if _RUNTIME:
        return _RUNTIME[0]
    lib = ctypes.CDLL(_C.__file__)
    vp, sz, i64p = ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int64)
    for name, res, argtypes in [
            ("pj_status_message", ctypes.c_char_p, [vp]), ("pj_status_code", ctypes.c_int, [vp]),
            ("pj_status_free", None, [vp]),
            ("pj_program_compile", vp, [ctypes.c_char_p, sz, ctypes.POINTER(vp)]),
            ("pj_program_free", None, [vp]), ("pj_program_num_outputs", sz, [vp]),
            ("pj_program_execute", vp, [vp, ctypes.c_int, ctypes.POINTER(vp), sz, vp,
                                        ctypes.POINTER(vp)]),
            ("pj_transfer_to_device", vp, [ctypes.c_int, vp, ctypes.c_int, i64p, ctypes.c_int,
                                           ctypes.POINTER(vp)]),
            ("pj_transfer_to_host", vp, [vp, vp, sz]), ("pj_buffer_nbytes", sz, [vp]),
            ("pj_buffer_destroy", None, [vp]),
            ("pj_dtype_info", ctypes.POINTER(_DtypeInfo), [ctypes.c_int])]:
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, argtypes
    codes = {}
    for code in range(len(_TORCH_OF_MLIR)):  # PJ_NUM_DTYPES entries
        info = lib.pj_dtype_info(code).contents
        dtype = _TORCH_OF_MLIR.get(info.mlir.decode())
        if dtype is None or dtype.itemsize != info.itemsize:
            raise RuntimeError(f"export_stablehlo: the runtime's dtype {code} "
                               f"({info.mlir.decode()!r}) is not one this module knows")
        codes[dtype] = code
    _RUNTIME.append((lib, codes))
    return _RUNTIME[0]


def _check_status(lib, st, what: str) -> None:
    if st:
        code = lib.pj_status_code(st)
        message = lib.pj_status_message(st).decode(errors="replace")
        lib.pj_status_free(st)
        raise _STATUS_ERRORS.get(code, RuntimeError)(f"run_text: {what}: {message}")


class _TextProgram:
    """A StableHLO text (``func.func @main``) compiled by the runtime for one device; called
    with one host tensor per argument (flat, of the argument's element type), it uploads them,
    executes the program and returns its results as flat CPU tensors."""

    def __init__(self, text: str, device: int):
        self._lib, self._codes = _runtime()
        self._prog = None
        self.text = text
        self.device = device
        _, _, args, results, body = _main_parts(text)
        self.arguments = args
        self.result_types = results
        self._body = text[body:]
        data = text.encode()
        prog = ctypes.c_void_p()
        _check_status(self._lib, self._lib.pj_program_compile(data, len(data), ctypes.byref(prog)),
                      "compiling the text")
        self._prog = prog
        n = self._lib.pj_program_num_outputs(prog)
        if n != len(results):
            raise RuntimeError(f"run_text: the compiled text has {n} results, @main declares "
                               f"{len(results)}")

    def reads(self, index: int) -> bool:
        """Whether the body uses argument ``index``."""
        name = re.escape(self.arguments[index].name)
        return re.search(name + r"(?![\w.$-])", self._body) is not None

    def __call__(self, host_args: list) -> list:
        lib = self._lib
        if len(host_args) != len(self.arguments):
            raise TypeError(f"run_text: @main takes {len(self.arguments)} arguments, got "
                            f"{len(host_args)}")
        vp = ctypes.c_void_p
        bufs = (vp * max(1, len(host_args)))()
        outs = (vp * max(1, len(self.result_types)))()
        keep = []
        try:
            for k, (arg, t) in enumerate(zip(self.arguments, host_args)):
                et, count = _tensor_type(arg.mlir_type)
                dtype = _TORCH_OF_MLIR.get(et)
                t = t.detach().cpu().contiguous()
                if t.dtype != dtype or t.numel() != (1 if count is None else count):
                    raise ValueError(f"run_text: @main argument {k} is {arg.mlir_type}, got "
                                     f"{t.numel()} elements of {t.dtype}")
                keep.append(t)
                dims = (ctypes.c_int64 * 1)(t.numel())
                buf = vp()
                _check_status(lib, lib.pj_transfer_to_device(
                    self.device, t.data_ptr(), self._codes[dtype], dims,
                    0 if count is None else 1, ctypes.byref(buf)), f"uploading argument {k}")
                bufs[k] = buf.value
            _check_status(lib, lib.pj_program_execute(self._prog, self.device, bufs,
                                                      len(host_args), None, outs),
                          "executing the text")
            results = []
            for r, ty in enumerate(self.result_types):
                et, count = _tensor_type(ty)
                dtype = _TORCH_OF_MLIR.get(et)
                if dtype is None:
                    raise NotImplementedError(f"run_text: result {r} has the type {ty}")
                out = torch.empty(() if count is None else (count,), dtype=dtype)
                nbytes = lib.pj_buffer_nbytes(outs[r])
                if nbytes != out.numel() * out.element_size():
                    raise RuntimeError(f"run_text: result {r} ({ty}) has {nbytes} bytes")
                if nbytes:
                    _check_status(lib, lib.pj_transfer_to_host(outs[r], out.data_ptr(), nbytes),
                                  f"downloading result {r}")
                results.append(out)
            return results
        finally:
            for b in list(bufs) + list(outs):
                if b:
                    lib.pj_buffer_destroy(b)

    def __del__(self):
        if getattr(self, "_prog", None) and _RUNTIME:
            _RUNTIME[0][0].pj_program_free(self._prog)
            self._prog = None


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

    ``weights``: ``"arguments"``, ``"constants"`` (the plan holds the weights; the text still
    takes them as arguments) or ``"inline"`` (the text holds them as ``stablehlo.constant``
    values: its arguments are the user inputs and capture constants); the module docstring
    (torch_pjrt/compile/export.py) says exactly what the text and ``run`` are in each mode.
    ``run_text`` executes the text itself through the runtime. The
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
    # the plan's inputs: every tensor ("arguments"), the user inputs ("constants"), the user
    # inputs and the buffers the program mutates ("inline": a constant could not be updated)
    free_user = [p for p in user_positions if const_user[p] is _NO_CONST]
    mutated = {s.target for s in sig.output_specs if s.kind == OutputKind.BUFFER_MUTATION}
    if weights == "arguments":
        plan_positions = tensor_pos
    elif weights == "constants":
        plan_positions = free_user
    else:
        plan_positions = sorted(free_user + [p for p in weight_positions
                                             if specs[p].kind == InputKind.BUFFER
                                             and specs[p].target in mutated])
    # every tensor an input of the plan: params() names the ExportedProgram input behind each
    # storage argument (-1: a capture constant)
    outs, entry, layout, reps, plan = _capture(gm, held, tensors)
    text = plan.text()
    sources = [tensor_pos[k] if k >= 0 else None for k in plan.params()]
    if plan_positions != tensor_pos:
        # the plan that runs: only plan_positions are inputs, the other weights become its
        # constants
        index = {p: k for k, p in enumerate(plan_positions)}
        del outs, reps, plan
        outs, entry, layout, reps, plan = _capture(gm, held, [held[p] for p in plan_positions])
        expect = [index.get(p, -1) for p in sources]
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
            inputs.append(ProgramInput(a, "scalar", "text" if weights == "inline" else "plan",
                                       None, None, (), dtype, mlir_type, alias,
                                       value=scalars[a - nparams]))
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
            source = ("module" if pos in plan_positions
                      else "text" if weights == "inline" else "plan")
            target = spec.target
        inputs.append(ProgramInput(a, kind, source, names[pos], target, tuple(t.shape), t.dtype,
                                   mlir_type, alias))
    unused = [names[p] for p in tensor_pos if p not in used]

    # -- weights="inline": the text with the weight (and scalar) arguments as constants --
    plan_text, inlined = text, []
    if weights == "inline":
        values = {i.index: (torch.tensor(i.value, dtype=i.dtype) if i.kind == "scalar"
                            else held[sources[i.index]])
                  for i in inputs if i.source == "text"}
        text = _inline_arguments(plan_text, values)
        inlined = [i for i in inputs if i.source == "text"]
        inputs = [dataclasses.replace(i, index=k)
                  for k, i in enumerate(i for i in inputs if i.source != "text")]
        new_args, new_results = _main_signature(text)
        if (new_args != [(i.mlir_type, i.aliased_result) for i in inputs]
                or new_results != result_types):
            raise RuntimeError("export_stablehlo: the inlined text's signature does not match "
                               "its description")

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
        plan_text=plan_text,
        inputs=inputs,
        inlined=inlined,
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
        _plan_positions=plan_positions,
        _text_compiled=None,
        _weight_positions=weight_positions,
        _const_user=const_user,
        _in_spec=ep.call_spec.in_spec,
        _out_spec=ep.call_spec.out_spec,
        _position_of_target={specs[p].target: p for p in weight_positions},
        _position_of_name={names[p]: p for p in user_positions},
    )
    return module

