"""One model, run on CPU and on tpu, compared: the eval-mode forward pass, one training step (loss,
backward, SGD step: the loss, every parameter's gradient and every updated parameter), and, where
the zoo asks for it, greedy `generate()` or a pipeline run.

A zoo describes a model as a `Case`; `run_case` turns it into one result record (a dict that
becomes a JSONL line). Statuses, worst first:

- ``error``: the tpu side raised (exception type and first line, the phase, where it was raised).
- ``mismatch``: tpu ran but a tensor differs from CPU beyond the tolerances below (the worst
  tensor by its error over the allowed error, with its largest absolute error).
- ``fallback``: values match but some aten ops ran on CPU through the fallback (their names and
  counts: torch.tpu.fallback_ops()).
- ``pass``: every compared tensor within tolerance, no fallback.
- ``skipped``: not a tpu result: CPU itself fails, inputs cannot be synthesized, the model is too
  large for this machine, or the zoo does not import (the reason says which).

The CPU model is built once under a fixed seed and deep-copied to tpu, so both start from the same
weights; inputs come from a seeded CPU generator and are copied. Dropout-like randomness is
switched off (configs are built with zero dropout; `quiet_randomness` also zeroes any dropout or
drop-path module left), so both devices compute the same function in train mode.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

# Float32 tolerances, elementwise: |tpu - cpu| <= atol + rtol * |cpu|. Gradients use an absolute
# tolerance scaled by the tensor's largest CPU magnitude (at least 1): a gradient is a sum over
# the batch and the layers above it, so its small elements carry the rounding of its large ones.
TOLERANCES = {
    "output": dict(rtol=1e-4, atol=1e-4, scaled=False),
    "loss": dict(rtol=1e-4, atol=1e-5, scaled=False),
    "grad": dict(rtol=1e-3, atol=1e-4, scaled=True),
    "param": dict(rtol=1e-4, atol=1e-5, scaled=True),
    # a few denoising steps compound rounding: the pipeline's image gets a looser bound
    "pipeline": dict(rtol=1e-3, atol=1e-3, scaled=False),
}
SGD_LR = 0.01
SEED = 0
INPUT_SEED = 1


class Skip(Exception):
    """The model cannot be tested here (the message says why); not a tpu failure."""


@dataclasses.dataclass
class Case:
    """What a zoo knows about one model.

    build: makes the CPU model (called under torch.manual_seed(SEED)); may raise Skip.
    inputs: gen -> keyword arguments for the eval forward pass (CPU tensors).
    train_inputs: gen -> keyword arguments for the training step (default: `inputs`); may include
      labels so the model computes its own loss.
    loss: output -> scalar loss; default: the output's `.loss` when it has one, else a fixed random
      projection of every floating output (so each output element gets its own gradient).
    generate: keyword arguments for `model.generate(**inputs, **generate)` (greedy), or None.
    pipeline: device -> {name: tensor}: a whole pipeline run on that device (built from the same
      seed inside), compared under the "pipeline" tolerance; replaces forward/train when set.
    canonical: eval output (on the CPU) -> the same output in a canonical order, applied to both
      devices' outputs before they are compared: for outputs whose order among exact ties is
      unspecified (detections with equal scores).
    """
    zoo: str
    name: str
    build: Optional[Callable[[], torch.nn.Module]] = None
    inputs: Optional[Callable[[torch.Generator], Dict[str, Any]]] = None
    train_inputs: Optional[Callable[[torch.Generator], Dict[str, Any]]] = None
    loss: Optional[Callable[[Any], torch.Tensor]] = None
    generate: Optional[Dict[str, Any]] = None
    pipeline: Optional[Callable[[torch.device], Dict[str, torch.Tensor]]] = None
    canonical: Optional[Callable[[Any], Any]] = None
    info: Dict[str, Any] = dataclasses.field(default_factory=dict)


# --- helpers -------------------------------------------------------------------------------------


def first_line(e: BaseException) -> str:
    msg = str(e).strip()
    line = msg.splitlines()[0] if msg else ""
    return f"{type(e).__name__}: {line}"[:400]


def where(e: BaseException) -> str:
    """The innermost frame of the traceback outside this harness: file (from site-packages or the
    package root on) and line, so reports can group errors by where they were raised."""
    frames = traceback.extract_tb(e.__traceback__)
    for fr in reversed(frames):
        if "/torch_pjrt/models/" in fr.filename:
            continue
        name = fr.filename
        for marker in ("site-packages/", "/torch_pjrt/"):
            if marker in name:
                name = name.split(marker, 1)[1]
                if marker == "/torch_pjrt/":
                    name = "torch_pjrt/" + name
                break
        return f"{name}:{fr.lineno} ({fr.name})"
    return ""


def flatten(obj: Any, prefix: str = "out") -> List[Tuple[str, torch.Tensor]]:
    """Every tensor in a (nested) model output, with a path naming it. Caches and other objects
    that are not tensors, mappings or sequences are left out."""
    items: List[Tuple[str, torch.Tensor]] = []
    if isinstance(obj, torch.Tensor):
        items.append((prefix, obj))
    elif isinstance(obj, dict):  # ModelOutput is an OrderedDict
        for k, v in obj.items():
            items += flatten(v, f"{prefix}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            items += flatten(v, f"{prefix}[{i}]")
    elif hasattr(obj, "sample") and isinstance(getattr(obj, "sample"), torch.Tensor):
        items.append((f"{prefix}.sample", obj.sample))  # diffusers outputs (dataclasses)
    return items


def to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device) for v in obj)
    return obj


def quiet_randomness(model: torch.nn.Module) -> None:
    """Zero every dropout probability and drop-path rate left in the modules (configs already ask
    for none; some layers take theirs from elsewhere)."""
    for m in model.modules():
        kind = type(m).__name__
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) or (
                isinstance(getattr(m, "p", None), float)
                and any(w in kind for w in ("Dropout", "DropPath", "StochasticDepth"))):
            m.p = 0.0  # torchvision's StochasticDepth keeps its rate in `p`
        for attr in ("drop_prob", "drop_path_prob", "dropout_prob"):
            if isinstance(getattr(m, attr, None), float):
                setattr(m, attr, 0.0)


@dataclasses.dataclass
class Diff:
    name: str
    ratio: float  # largest |tpu - cpu| / allowed over the elements (inf: NaN/shape/dtype problem)
    max_abs: float
    note: str = ""

    def as_dict(self) -> dict:
        r = {"tensor": self.name, "max_abs_err": _num(self.max_abs), "err_over_tol": _num(self.ratio)}
        if self.note:
            r["note"] = self.note
        return r


def _num(x: float):
    return x if math.isfinite(x) else str(x)


def diff(name: str, cpu: torch.Tensor, tpu: torch.Tensor, kind: str) -> Diff:
    """How far `tpu` is from `cpu` under the tolerance of `kind` (ratio <= 1: within it)."""
    tol = TOLERANCES[kind]
    t = tpu.detach().cpu()
    c = cpu.detach()
    if t.shape != c.shape:
        return Diff(name, math.inf, math.inf, f"shape tpu {tuple(t.shape)} cpu {tuple(c.shape)}")
    if t.dtype != c.dtype:
        return Diff(name, math.inf, math.inf, f"dtype tpu {t.dtype} cpu {c.dtype}")
    if c.numel() == 0:
        return Diff(name, 0.0, 0.0)
    if not (c.is_floating_point() or c.is_complex()):
        bad = int((t != c).sum())
        return Diff(name, math.inf if bad else 0.0, float(bad), f"{bad} elements differ" if bad else "")
    if c.is_complex():
        c, t = torch.view_as_real(c), torch.view_as_real(t)
    c64, t64 = c.double(), t.double()
    nan_c, nan_t = torch.isnan(c64), torch.isnan(t64)
    if not torch.equal(nan_c, nan_t):
        return Diff(name, math.inf, math.inf, f"NaN on {'tpu' if nan_t.sum() > nan_c.sum() else 'cpu'} "
                    f"only ({int((nan_c != nan_t).sum())} elements)")
    ok = ~nan_c
    inf_c = torch.isinf(c64) & ok
    if not torch.equal(c64[inf_c], t64[inf_c]) or bool(torch.isinf(t64[ok & ~inf_c]).any()):
        return Diff(name, math.inf, math.inf, "inf differs")
    fin = ok & ~inf_c
    c64, t64 = c64[fin], t64[fin]
    if c64.numel() == 0:
        return Diff(name, 0.0, 0.0)
    err = (t64 - c64).abs()
    atol = tol["atol"] * (max(1.0, float(c64.abs().max())) if tol["scaled"] else 1.0)
    allowed = atol + tol["rtol"] * c64.abs()
    return Diff(name, float((err / allowed).max()), float(err.max()))


_diff = diff  # the module-level comparison, for functions with a local `diff`


def worst(diffs: List[Diff]) -> Optional[Diff]:
    return max(diffs, key=lambda d: d.ratio) if diffs else None


def projection_loss(out: Any) -> torch.Tensor:
    """sum over floating outputs of <output, W>, W a fixed random tensor per output (drawn on CPU
    from a seeded generator, so both devices use the same W), scaled by 1/numel."""
    total = None
    gen = torch.Generator().manual_seed(1234)
    for _, t in flatten(out):
        if not t.is_floating_point() or not t.requires_grad:
            continue
        w = torch.randn(t.shape, generator=gen, dtype=torch.float32).to(t.device, t.dtype)
        term = (t * w).sum() / max(1, t.numel())
        total = term if total is None else total + term
    if total is None:
        raise Skip("no floating output that requires grad: nothing to train")
    return total


def default_loss(out: Any) -> torch.Tensor:
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss
    if isinstance(out, dict) and isinstance(out.get("loss"), torch.Tensor) and out["loss"].requires_grad:
        return out["loss"]
    return projection_loss(out)


class FixedProjectionLoss:
    """default_loss with projection_loss's random tensors drawn ahead, from the shapes of an
    output (the CPU's: the same draws in the same order, so the same W) and placed on `device`.
    Compiled mode's loss: a generator created inside a compiled function is a graph break
    (torch.Generator cannot be traced), which would be the harness's, not the model's."""

    def __init__(self, out: Any, device: torch.device):
        gen = torch.Generator().manual_seed(1234)
        self.ws = [torch.randn(t.shape, generator=gen, dtype=torch.float32).to(device, t.dtype)
                   for _, t in flatten(out) if t.is_floating_point() and t.requires_grad]

    def __call__(self, out: Any) -> torch.Tensor:
        loss = getattr(out, "loss", None)
        if isinstance(loss, torch.Tensor) and loss.requires_grad:
            return loss
        if isinstance(out, dict) and isinstance(out.get("loss"), torch.Tensor) and out["loss"].requires_grad:
            return out["loss"]
        total = None
        i = 0
        for _, t in flatten(out):
            if not t.is_floating_point() or not t.requires_grad:
                continue
            term = (t * self.ws[i]).sum() / max(1, t.numel())
            i += 1
            total = term if total is None else total + term
        if total is None:
            raise Skip("no floating output that requires grad: nothing to train")
        return total


class FallbackWatch:
    """CPU fallbacks during a with-block: the ops (with counts) that fell back."""

    def __init__(self, into: List["FallbackWatch"]):
        into.append(self)  # listed before the block runs, so an error inside still reports it
        self.ops: Dict[str, int] = {}
        self.count = 0

    def __enter__(self):
        self.before = dict(torch.tpu.fallback_ops())
        self.count0 = int(torch.tpu.metrics()["cpu_fallbacks"])
        return self

    def __exit__(self, *exc):
        self.ops = {k: v - self.before.get(k, 0) for k, v in torch.tpu.fallback_ops().items()
                    if v != self.before.get(k, 0)}
        self.count = int(torch.tpu.metrics()["cpu_fallbacks"]) - self.count0
        return False


# --- compiled mode: Dynamo's accounting ---------------------------------------------------------

MODES = ("eager", "compile")
# the artifact logger Dynamo writes each recompilation (with its guard failure) to
_RECOMPILES_LOGGER = "torch._dynamo.guards.__recompiles"


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(record.getMessage())
        except Exception:
            pass


class DynamoStats:
    """What Dynamo did for one case in compiled mode. Starts from a clean Dynamo (reset: no
    cached frames from the previous model, counters cleared) and reads, on `snapshot()`: the
    graphs compiled (counters["stats"]["unique_graphs"]), graph breaks with their reasons and
    counts (counters["graph_break"]), recompilations with their guard failures (Dynamo's
    "recompiles" log), and the change of torch.tpu.metrics()' graph_runs, graph_captures and
    compiles."""

    METRICS = ("graph_runs", "graph_captures", "graph_captures_broken", "compiles")

    def __init__(self):
        import torch._dynamo as dynamo  # `import torch._dynamo` would make `torch` a local
        from torch._dynamo.utils import counters
        self.counters = counters
        dynamo.reset()
        counters.clear()
        self.m0 = dict(torch.tpu.metrics())
        self.handler = _Lines()
        self.logger = logging.getLogger(_RECOMPILES_LOGGER)
        self.level, self.propagate = self.logger.level, self.logger.propagate
        self.logger.addHandler(self.handler)
        self.logger.setLevel(logging.DEBUG)
        self.logger.propagate = False  # kept here, not printed
        self._enable_recompile_log()

    @staticmethod
    def _enable_recompile_log() -> None:
        # Dynamo formats recompile reasons only when its "recompiles" artifact is enabled
        try:
            from torch._logging._internal import log_state
            log_state.enable_artifact("recompiles")
        except Exception:
            pass

    def graphs(self) -> int:
        return int(self.counters["stats"]["unique_graphs"])

    def snapshot(self) -> Dict[str, Any]:
        m = torch.tpu.metrics()
        breaks: Dict[str, int] = {}
        for k, v in self.counters["graph_break"].items():
            key = break_reason(str(k))
            breaks[key] = breaks.get(key, 0) + int(v)
        recompiles = [ln for ln in self.handler.lines if "Recompiling" in ln]
        return {
            "graphs": self.graphs(),
            "graph_breaks": sum(breaks.values()),
            "break_reasons": breaks,
            "recompiles": len(recompiles),
            "recompile_reasons": [_recompile_reason(ln) for ln in recompiles][:10],
            "frames": int(self.counters["frames"]["total"]),
            **{k: int(m.get(k, 0)) - int(self.m0.get(k, 0)) for k in self.METRICS},
        }

    def close(self) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.level)
        self.logger.propagate = self.propagate


def break_reason(message: str) -> str:
    """Dynamo's graph-break message (title, explanation, hint, debug context, link) -> 'title:
    debug context', object addresses blanked, so one cause reads as one line and groups."""
    import re
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    title = lines[0] if lines else message
    ctx = next((ln.split(":", 1)[1].strip() for ln in lines
                if ln.startswith("Developer debug context:")), "")
    out = f"{title}: {ctx}" if ctx and ctx not in title else title
    return re.sub(r" at 0x[0-9a-f]+", "", out)[:300]


def _recompile_reason(message: str) -> str:
    """'Recompiling function forward in f.py:12 / triggered by ... / - guard' -> 'forward: guard'."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    head = lines[0] if lines else message
    fn = head.split("Recompiling function", 1)[-1].strip().split(" in ", 1)[0]
    guards = [ln.lstrip("- ").strip() for ln in lines[1:] if ln.startswith("-")]
    import re
    return re.sub(r"\s+", " ", f"{fn}: {guards[0] if guards else head}")[:300]


def _compile_phase(rec: dict, phase: str, compiled: bool) -> None:
    """In compiled mode, the graphs Dynamo compiled during `phase` (since the phase before)."""
    if not compiled:
        return
    from torch._dynamo.utils import counters
    total = int(counters["stats"]["unique_graphs"])
    per = rec.setdefault("compile_phases", {})
    per[phase] = total - sum(per.values())


# --- the run -------------------------------------------------------------------------------------


class _TpuError(Exception):
    def __init__(self, phase: str, exc: BaseException):
        super().__init__(phase)
        self.phase, self.exc = phase, exc


def _compile_cause(e: BaseException) -> BaseException:
    """The exception a Dynamo failure wraps, else `e`: BackendCompilerFailed's first line only
    names the backend, TorchRuntimeError's ("RuntimeError when making fake tensor call") only
    the stage; the cause says what failed."""
    for _ in range(8):
        inner = getattr(e, "inner_exception", None)
        if not isinstance(inner, BaseException) and type(e).__module__.startswith("torch._dynamo"):
            inner = e.__cause__
        if not isinstance(inner, BaseException):
            break
        e = inner
    return e


def _explained(e: BaseException) -> str:
    """For Dynamo's errors in its graph-break format (a title line, then "Explanation: ..."):
    what the explanation says failed (after its last ": got "), else ''. "RuntimeError when
    making fake tensor call" names no op; its explanation names the op's own error."""
    if not type(e).__module__.startswith("torch._dynamo"):
        return ""
    for ln in str(e).splitlines():
        ln = ln.strip()
        if ln.startswith("Explanation:"):
            got = ln.rsplit(": got ", 1)
            what = got[1] if len(got) == 2 else ln[len("Explanation:"):].strip()
            import re
            op = re.search(r"call_function <built-in method (\w+)|call_function (\S+)", ln)
            name = (op.group(1) or op.group(2)) if op else ""
            return f" ({name + ': ' if name else ''}{re.sub(r' at 0x[0-9a-f]+', '', what)})"[:400]
    return ""


def _on_cpu(phase: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Skip:
        raise
    except Exception as e:  # the model or its inputs fail on CPU: not a tpu result
        raise Skip(f"CPU fails ({phase}): {first_line(e)}") from e


def _on_tpu(phase: str, fn: Callable[[], Any]) -> Any:
    try:
        out = fn()
        torch.tpu.synchronize()
        return out
    except Exception as e:
        raise _TpuError(phase, e) from e


def _unregistered_modules(model: torch.nn.Module) -> str:
    """The first attribute that holds, in a plain list, tuple or dict, a module with tensors that
    are not the model's registered parameters or buffers ('' if none)."""
    known = {id(t) for t in model.parameters()} | {id(t) for t in model.buffers()}
    for prefix, mod in model.named_modules():
        for attr, val in vars(mod).items():
            if attr.startswith("_") or not isinstance(val, (list, tuple, dict)):
                continue
            items = val.values() if isinstance(val, dict) else val
            for item in items:
                if isinstance(item, torch.nn.Module) and any(
                        id(t) not in known for t in (*item.parameters(), *item.buffers())):
                    return f"{prefix + '.' if prefix else ''}{attr}"
    return ""


@contextlib.contextmanager
def _float32_default():
    """Models are built and inputs drawn under float32 as the default dtype, whatever the run's
    dtype: a float64 default would draw other random numbers (other weights, other inputs)."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def _seeded_inputs(fn: Callable[[torch.Generator], Dict[str, Any]]) -> Dict[str, Any]:
    with _float32_default():
        return fn(torch.Generator().manual_seed(INPUT_SEED))


def _build(case: Case) -> torch.nn.Module:
    with _float32_default():
        return case.build()


def _param_grads(model: torch.nn.Module) -> Dict[str, Optional[torch.Tensor]]:
    return {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def _map_floats(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """`fn` applied to each floating tensor of `obj` (nested dicts, lists, tuples, in order);
    anything else as is."""
    if isinstance(obj, torch.Tensor):
        return fn(obj) if obj.is_floating_point() else obj
    if isinstance(obj, dict):
        return {k: _map_floats(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_floats(v, fn) for v in obj)
    return obj


def _cast_floats(obj: Any, dtype: torch.dtype) -> Any:
    return _map_floats(obj, lambda t: t.to(dtype))


Keep = Callable[[str, torch.Tensor, torch.Tensor, str], None]


def _forward_and_train(case: Case, rec: dict, watch: List[FallbackWatch],
                       dtype: torch.dtype = torch.float32, keep: Optional[Keep] = None,
                       compiled: bool = False) -> List[Diff]:
    """The forward / training-step / generate comparison in `dtype` (float32; float64 for the
    rounding check). `keep`, when given, is called with every compared pair (name, cpu tensor,
    tpu tensor, kind) when it is compared; the tensors may change afterwards (the SGD step).

    `compiled`: the tpu side as `torch.compile` users write it (no backend=, fullgraph=False;
    tpu graphs go to this project's backend through inductor_route): the eval forward is
    `torch.compile(model)`, the training step's forward and loss one compiled function (its
    backward is the compiled AOTAutograd backward) and the SGD step `torch.compile(opt.step)`.
    Generation is not run (only the forward and the training step are compiled). CPU stays
    eager: the reference is the same as the eager mode's."""
    tpu_dev = torch.device("tpu")

    def diff(name: str, c: torch.Tensor, t: torch.Tensor, kind: str) -> Diff:
        if keep is not None:
            keep(name, c, t, kind)
        return _diff(name, c, t, kind)

    torch.manual_seed(SEED)
    cpu = _on_cpu("build", lambda: _build(case))
    cpu = cpu.to(dtype)
    quiet_randomness(cpu)
    rec["params"] = sum(p.numel() for p in cpu.parameters())
    stray = _unregistered_modules(cpu)
    if stray:
        raise Skip(f"the model keeps layers in a plain Python container ({stray}), which "
                   ".to(device) does not move: it runs on the CPU only (on CUDA as well)")
    try:
        tpu_model = copy.deepcopy(cpu)
    except Exception:  # some modules hold objects deepcopy refuses; rebuild from the same seed
        torch.manual_seed(SEED)
        tpu_model = _build(case).to(dtype)
        quiet_randomness(tpu_model)
    inputs = _on_cpu("inputs", lambda: _cast_floats(_seeded_inputs(case.inputs), dtype))
    diffs: List[Diff] = []
    phases = rec["phases"]

    # eval forward
    cpu.eval()
    with torch.no_grad():
        out_c = _on_cpu("forward", lambda: cpu(**inputs))
    canon = case.canonical or (lambda out: out)
    out_c = canon(out_c)
    ref = flatten(out_c)
    if not ref:
        raise Skip("the forward pass returns no tensor to compare")
    # a forward pass that draws random numbers even in eval mode (random masking, as in MAE)
    # cannot match across devices; detected by running it again under another seed
    torch.manual_seed(SEED + 1)
    with torch.no_grad():
        again = dict(flatten(canon(cpu(**inputs))))
    torch.manual_seed(SEED)
    if any(n in again and _diff(n, c, again[n], "output").ratio > 1.0 for n, c in ref):
        raise Skip("CPU's eval forward pass uses the random number generator (its outputs change "
                   "under another seed): not comparable across devices")
    with FallbackWatch(watch):
        tpu_model = _on_tpu("to(tpu)", lambda: tpu_model.to(tpu_dev))
        tpu_model.eval()
        fwd_t = torch.compile(tpu_model) if compiled else tpu_model
        with torch.no_grad():
            out_t = _on_tpu("forward", lambda: fwd_t(**to_device(inputs, tpu_dev)))
        _compile_phase(rec, "forward", compiled)
    if case.canonical is not None:  # canonical orders are computed on the CPU
        out_t = canon(to_device(out_t, torch.device("cpu")))
    got = dict(flatten(out_t))
    fwd = []
    for name, c in ref:
        if name not in got:
            fwd.append(Diff(name, math.inf, math.inf, "missing from the tpu output"))
        else:
            fwd.append(diff(name, c, got[name], "output"))
    diffs += fwd
    phases["forward"] = _phase_status(fwd)
    del out_t, got

    # one training step
    trainable = [p for p in cpu.parameters() if p.requires_grad]
    if not trainable:
        phases["train"] = "skipped: no trainable parameter"
    else:
        train_inputs = _cast_floats(_seeded_inputs(case.train_inputs or case.inputs), dtype)
        loss_fn = case.loss or default_loss
        cpu.train()
        opt_c = torch.optim.SGD(cpu.parameters(), lr=SGD_LR)

        out_kept: List[Any] = []

        def cpu_step():
            opt_c.zero_grad(set_to_none=True)
            out = cpu(**train_inputs)
            if compiled and case.loss is None:
                out_kept.append(out)  # its shapes make the compiled loss's projection
            loss = loss_fn(out)
            loss.backward()
            return loss

        # A training step that draws random numbers (Gumbel sampling, random masking left in a
        # model's code) cannot match across devices: their generators differ. Detected by
        # running the CPU step on a copy under another seed first.
        try:
            twin = copy.deepcopy(cpu)
            torch.manual_seed(SEED + 1)
            # with grad enabled: the default loss picks outputs that require grad
            loss_twin = loss_fn(twin(**train_inputs)).detach()
            del twin
        except Exception:
            loss_twin = None
        try:
            torch.manual_seed(SEED)
            loss_c = _on_cpu("train", cpu_step)
        except Skip as s:
            phases["train"] = f"skipped: {s}"
            loss_c = None
        if loss_c is not None and loss_twin is not None and not torch.allclose(
                loss_twin, loss_c.detach(), rtol=1e-6, atol=0.0, equal_nan=True):
            phases["train"] = ("skipped: the training step uses the random number generator (CPU's "
                               "loss differs under another seed)")
            loss_c = None
        if loss_c is not None:
            grads_c = {n: (g.clone() if g is not None else None) for n, g in _param_grads(cpu).items()}
            opt_c.step()
            tpu_model.train()
            opt_t = torch.optim.SGD(tpu_model.parameters(), lr=SGD_LR)

            loss_t_fn = (FixedProjectionLoss(out_kept[0], tpu_dev) if out_kept else loss_fn)
            out_kept.clear()

            def forward_loss(kwargs):
                return loss_t_fn(tpu_model(**kwargs))

            if compiled:
                forward_loss = torch.compile(forward_loss)
            sgd_step = torch.compile(opt_t.step) if compiled else opt_t.step

            def tpu_step():
                torch.manual_seed(SEED)
                opt_t.zero_grad(set_to_none=True)
                loss = forward_loss(to_device(train_inputs, tpu_dev))
                loss.backward()
                return loss

            with FallbackWatch(watch):
                loss_t = _on_tpu("train", tpu_step)
                grads_t = _param_grads(tpu_model)
                tr = [diff("loss", loss_c, loss_t, "loss")]
                zero_only: List[str] = []
                for n, gc in grads_c.items():
                    gt = grads_t.get(n)
                    if compiled and gc is None and gt is not None and not bool(gt.any()):
                        # PyTorch's compiled autograd semantics, not this backend's: a compiled
                        # graph's backward returns a gradient for every input that requires
                        # one, zeros for a parameter whose outputs the loss never reads, where
                        # eager autograd leaves `.grad` None (CPU `aot_eager` does the same).
                        # Equal values; the SGD step below still compares the parameter.
                        zero_only.append(n)
                    elif (gc is None) != (gt is None):
                        tr.append(Diff(f"grad {n}", math.inf, math.inf,
                                       f"gradient on {'tpu' if gc is None else 'cpu'} only"))
                    elif gc is not None:
                        tr.append(diff(f"grad {n}", gc, gt, "grad"))
                if zero_only:
                    rec.setdefault("info", {})["zero_grad_where_eager_none"] = zero_only
                _compile_phase(rec, "train", compiled)
                _on_tpu("sgd step", sgd_step)
                _compile_phase(rec, "sgd step", compiled)
                params_t = dict(tpu_model.named_parameters())
                for n, pc in cpu.named_parameters():
                    if pc.requires_grad and n in params_t:
                        tr.append(diff(f"param {n} after SGD", pc, params_t[n], "param"))
            rec["loss_cpu"] = float(loss_c.detach())
            diffs += tr
            phases["train"] = _phase_status(tr)

    # greedy generation
    if case.generate is not None and not compiled:
        gen_inputs = _cast_floats(_seeded_inputs(case.inputs), dtype)
        cpu.eval()
        tpu_model.eval()
        try:
            with torch.no_grad():
                toks_c = _on_cpu("generate", lambda: cpu.generate(**gen_inputs, **case.generate))
        except Skip as s:
            phases["generate"] = f"skipped: {s}"
        else:
            with FallbackWatch(watch):
                with torch.no_grad():
                    toks_t = _on_tpu("generate", lambda: tpu_model.generate(
                        **to_device(gen_inputs, tpu_dev), **case.generate))
            toks_c = toks_c if isinstance(toks_c, torch.Tensor) else toks_c.sequences
            toks_t = toks_t if isinstance(toks_t, torch.Tensor) else toks_t.sequences
            g = [diff("generate tokens", toks_c, toks_t, "output")]
            diffs += g
            phases["generate"] = _phase_status(g)
            rec["generated"] = toks_c.tolist()
    return diffs


def _pipeline(case: Case, rec: dict, watch: List[FallbackWatch]) -> List[Diff]:
    ref = _on_cpu("pipeline", lambda: case.pipeline(torch.device("cpu")))
    with FallbackWatch(watch):
        got = _on_tpu("pipeline", lambda: case.pipeline(torch.device("tpu")))
    diffs = [diff(k, v, got[k], "pipeline") if k in got else
             Diff(k, math.inf, math.inf, "missing from the tpu run") for k, v in ref.items()]
    rec["phases"]["pipeline"] = _phase_status(diffs)
    return diffs


def _phase_status(diffs: List[Diff]) -> str:
    return "pass" if all(d.ratio <= 1.0 for d in diffs) else "mismatch"


# The float64 check of a float32 mismatch: the case is run again in float64 on both devices. It
# counts as float32 rounding, not a wrong result, when (1) every float64 tensor matches CPU's
# under the same tolerances (the same function is computed), and (2) tpu's float32 is about as
# accurate as CPU's: either the model's float32 results are at their worst no further from
# CPU's float64 results than ROUNDING_FACTOR times CPU's own float32 results are at theirs, or,
# where the model amplifies rounding more than that one CPU run happened to show, every op of
# the eval forward and the training step is, on its own inputs, no more than ROUNDING_FACTOR
# times as far from CPU's float64 result as CPU's float32 kernel is (precision.py; integer
# outputs equal). Batch norm over a handful of values per channel, or near-ties at a max pool or
# ReLU, amplify 1-ulp differences that far: CPU's own float32 result moves by as much under a
# 1e-7 input change, or under another of CPU's own convolution algorithms.
ROUNDING_FACTOR = 10.0
# CPU's own float32 accuracy is taken as the worst of its plain run and this many more, each
# with the inputs and parameters moved by one ulp (up or down at random): a single run's
# distance from float64 is one sample of how far the model carries rounding (lcnetv2_base's
# training step: 9.4x the tolerance in one CPU run, 300x-3,500x in three runs moved by one ulp).
JITTERED_RUNS = 2


def _one_ulp(obj: Any, gen: torch.Generator) -> Any:
    """Floating tensors of `obj` (nested dicts, lists, tuples) moved by one ulp each, up or down
    at random; anything else as is."""
    def move(t: torch.Tensor) -> torch.Tensor:
        up = torch.randint(0, 2, t.shape, generator=gen, dtype=torch.bool)
        inf = torch.tensor(math.inf, dtype=t.dtype)
        return torch.where(up, torch.nextafter(t, inf), torch.nextafter(t, -inf))
    return _map_floats(obj, move)


def _jittered_cpu_run(case: Case, seed: int) -> Dict[str, torch.Tensor]:
    """CPU's float32 eval forward and training step as _forward_and_train runs them (same
    model, seeds, loss and SGD step, same tensor names), with the inputs and parameters moved
    by one ulp (_one_ulp, generator seeded with `seed`)."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(SEED)
    model = _build(case)
    quiet_randomness(model)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(_one_ulp(p.detach(), gen))
    got: Dict[str, torch.Tensor] = {}
    model.eval()
    with torch.no_grad():
        out = model(**_one_ulp(_seeded_inputs(case.inputs), gen))
    got.update(flatten((case.canonical or (lambda o: o))(out)))
    if any(p.requires_grad for p in model.parameters()):
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=SGD_LR)
        train_inputs = _one_ulp(_seeded_inputs(case.train_inputs or case.inputs), gen)
        torch.manual_seed(SEED)
        loss = (case.loss or default_loss)(model(**train_inputs))
        loss.backward()
        got["loss"] = loss.detach()
        got.update((f"grad {n}", g.clone()) for n, g in _param_grads(model).items()
                   if g is not None)
        opt.step()
        got.update((f"param {n} after SGD", p.detach())
                   for n, p in model.named_parameters() if p.requires_grad)
    return got


def _rounding_check(case: Case, keep32: Dict[str, Tuple[torch.Tensor, torch.Tensor, str]],
                    bad: List[Diff], compiled: bool = False) -> Tuple[bool, str]:
    # a shape, NaN/inf placement or integer difference has no distance to weigh (see below)
    discrete = [d for d in bad if math.isinf(d.ratio)]
    if any(d.note.startswith(("dtype", "missing", "gradient")) for d in discrete):
        return False, "not a rounding difference (a dtype, or a tensor or gradient on one side only)"
    rec64: Dict[str, Any] = {"phases": {}}
    # Compiled mode: the per-op audit checks eager ops, so the model is also run eagerly on
    # tpu (float32) and the compiled run is judged against that run: closeness (a discrete
    # difference must not be the compiled programs') and accuracy against CPU's float64
    eager32: Optional[Dict[str, torch.Tensor]] = None
    closeness: Tuple[bool, str] = (True, "")
    if compiled:
        eager32, closeness = _eager_tpu_run(case, {n: (p[1], p[2]) for n, p in keep32.items()})
    eager_accuracy: Dict[str, float] = {}
    # name -> (tpu float32's, CPU float32's distance from CPU's float64 result, as ratios to
    # the tolerance), computed as each float64 tensor is compared: keeping the float64 tensors
    # for later doubled the check's memory (a 138M-parameter VGG's gradients and parameters)
    accuracy: Dict[str, Tuple[float, float]] = {}
    unmatched = keep32  # consumed: a float32 pair is dropped once its float64 result is seen
    # CPU's float32 runs moved by one ulp, made before the float64 run (whose tensors are not
    # kept) and consumed as it goes; a run CPU cannot make leaves the plain run alone
    jittered: List[Dict[str, torch.Tensor]] = []
    for k in range(JITTERED_RUNS):
        try:
            jittered.append(_jittered_cpu_run(case, seed=1000 + k))
        except Exception:
            break

    def against_float64(name: str, c64: torch.Tensor, t64: torch.Tensor, kind: str) -> None:
        pair = unmatched.pop(name, None)
        if pair is None:
            return
        c32, t32 = pair[0], pair[1]
        c64 = c64.detach()
        if c64.is_floating_point():  # a dtype fixed inside the model (a .float() loss) stays
            c64, t32, c32 = c64.double(), t32.double(), c32.double()
        cpu_ratio = _diff(name, c64, c32, kind).ratio
        for run in jittered:
            j32 = run.pop(name, None)
            if j32 is not None:
                j32 = j32.double() if c64.is_floating_point() else j32
                cpu_ratio = max(cpu_ratio, _diff(name, c64, j32, kind).ratio)
        accuracy[name] = (_diff(name, c64, t32, kind).ratio, cpu_ratio)
        e32 = eager32.pop(name, None) if eager32 is not None else None
        if e32 is not None:
            eager_accuracy[name] = _diff(name, c64, e32.double() if c64.is_floating_point()
                                         else e32, kind).ratio

    default = torch.get_default_dtype()
    no64 = None
    try:
        # float64 also by default while the models run: tensors a model creates inside
        # (coordinate grids) match it; weights and inputs are still drawn in float32
        torch.set_default_dtype(torch.float64)
        if compiled:  # the float64 run compiles its own graphs (its counts are not recorded)
            import torch._dynamo as dynamo
            dynamo.reset()
        diffs64 = _forward_and_train(case, rec64, [], torch.float64, against_float64,
                                     compiled=compiled)
    except Skip as s:
        no64 = s
    except _TpuError as e:
        return False, f"float64 check: tpu {e.phase}: {first_line(e.exc)}"
    except Exception as e:
        return False, f"float64 check: {first_line(e)}"
    finally:
        torch.set_default_dtype(default)
    if no64 is not None:
        # CPU itself cannot run the model in float64 (a dtype fixed inside it): the op-by-op
        # audit alone decides, provided it could check every op
        return _audit_verdict(case, closeness if compiled else None,
                              f"float64 not possible ({no64})", None, require_all=True)
    bad64 = [d for d in diffs64 if d.ratio > 1.0]
    if bad64:
        w = worst(bad64)
        return False, f"float64 differs as well: {w.name} {w.ratio:.3g}x the tolerance"
    for d in bad:
        if d.name in unmatched:
            return False, f"float64 check: {d.name} has no float64 counterpart"
    if discrete:
        # A decision at a threshold (a keypoint score, a count, an argmax between near-equal
        # values) that rounding flips changes a shape or integer values. It is rounding only
        # when CPU's own float32 result also departs from CPU's float64 in each such tensor
        # (float64 matching on both devices, checked above), and then every op must be as
        # accurate as CPU's on its own inputs (the audit; integer results equal).
        steady = [d.name for d in discrete if accuracy.get(d.name, (0.0, 0.0))[1] <= 1.0]
        if steady:
            return False, (f"not a rounding difference: {', '.join(steady[:3])} differ in shape, "
                           "NaN/inf or integer values where CPU's own float32 matches its float64")
        names = ", ".join(d.name for d in discrete[:3])
        return _audit_verdict(
            case, closeness if compiled else None,
            f"{names} differ in shape, NaN/inf or integer values, as CPU's own float32 "
            f"does from CPU's float64; in float64 tpu matches CPU (worst {worst(diffs64).ratio:.2g}x "
            "the tolerance)", None, require_all=True)
    # accuracy of each side's float32 against CPU's float64, at each side's worst tensor (per
    # tensor the figures are noisy: which tensor an amplified rounding lands in varies)
    et_w = ec_w = 0.0
    et_name = ec_name = ""
    for name, (et, ec) in accuracy.items():
        if et > et_w:
            et_w, et_name = et, name
        if ec > ec_w:
            ec_w, ec_name = ec, name
    if not math.isfinite(et_w):
        return False, f"float64 matches, but {et_name} cannot be compared with CPU's float64"
    figures = (f"tpu's float32 at worst {et_w:.3g}x the tolerance from CPU's float64 ({et_name}), "
               f"CPU's own float32 {ec_w:.3g}x ({ec_name}"
               + (f"; the worst of its plain run and {len(jittered)} with inputs and parameters "
                  "moved by one ulp)" if jittered else ")"))
    worst64 = worst(diffs64)
    matched = (f"float32 rounding: in float64 tpu matches CPU (worst {worst64.ratio:.2g}x the "
               f"tolerance); {figures}")
    if et_w <= ROUNDING_FACTOR * max(ec_w, 1.0):
        return True, matched
    # The model amplifies rounding more than CPU's own float32 run happened to show (which
    # tensor an amplified error lands in varies from run to run): ask op by op instead.
    compiled_check = None
    if compiled and (eager32 is None or not eager_accuracy):
        compiled_check = closeness if eager32 is None else (
            False, "the eager tpu run has no tensor to weigh against CPU's float64")
    elif compiled:
        # the compiled run is as accurate as the eager tpu run, whose ops the audit checks
        ee_w = max(eager_accuracy.values())
        compiled_check = (et_w <= ROUNDING_FACTOR * max(ee_w, 1.0),
                          f"the eager tpu run's float32 at worst {ee_w:.3g}x the tolerance from "
                          f"CPU's float64, the compiled run's {et_w:.3g}x")
    return _audit_verdict(case, compiled_check, f"float64 matches, but {figures}", matched,
                          require_all=False)


def _audit_verdict(case: Case, compiled_check: Optional[Tuple[bool, str]], why: str,
                   matched: Optional[str], require_all: bool) -> Tuple[bool, str]:
    """The per-op audit's verdict: rounding when every audited op is within ROUNDING_FACTOR of
    CPU float32's own error (and, with require_all, CPU could rerun every op). The audit runs
    ops eagerly, one by one, so it says nothing directly about a compiled program (whose
    fusions XLA chooses). In compiled mode `compiled_check` (ok, what was found) says how the
    compiled run compares with the same model run eagerly on tpu (_rounding_check): only when
    it holds is the audit of the eager ops consulted."""
    compiled_note = ""
    if compiled_check is not None:
        ok, compiled_note = compiled_check
        if not ok:
            return False, f"{why}; {compiled_note}"
    try:
        ops = _audit_ops(case)
    except Exception as e:
        return False, f"{why}; per-op audit failed: {first_line(e)}"
    w = max(ops.ops.values(), key=lambda o: o.ratio, default=None)
    if w is None:
        return False, f"{why}; the per-op audit saw no op"
    audit = (f"per-op audit ({len(ops.ops)} ops on the same inputs as CPU's): worst {w.op}, tpu "
             f"error {w.tpu_err:.3g} against CPU float32's {w.cpu_err:.3g}, {w.ratio:.3g}x")
    if compiled_note:
        audit = f"{compiled_note}; {audit}"
    if w.ratio > ROUNDING_FACTOR:
        return False, f"{why}; {audit}"
    if require_all and ops.skipped:
        return False, f"{why}; {audit}, but CPU could not rerun {sorted(ops.skipped)}"
    return True, f"{matched}; {audit}" if matched else f"float32 rounding: {why}; {audit}"


def _eager_tpu_run(case: Case, compiled32: Dict[str, Tuple[torch.Tensor, str]]
                   ) -> Tuple[Optional[Dict[str, torch.Tensor]], Tuple[bool, str]]:
    """Compiled mode's reference: the case's forward and training step run eagerly on tpu
    (float32, the same seeds). Returns its compared tensors (None if it failed) and whether
    every tensor of the compiled run is within the harness's tolerance of the eager run's
    (ok, what was found)."""
    eager32: Dict[str, torch.Tensor] = {}

    def keep(name: str, c: torch.Tensor, t: torch.Tensor, kind: str) -> None:
        eager32[name] = t.detach().cpu().clone()

    try:
        _forward_and_train(case, {"phases": {}}, [], keep=keep, compiled=False)
    except Exception as e:
        return None, (False, f"the eager tpu run for the compiled-mode audit failed: "
                             f"{first_line(e)}")
    missing = [n for n in compiled32 if n not in eager32]
    if missing:
        return eager32, (False, f"the eager tpu run has no {missing[0]} to compare the compiled "
                                "run's with")
    diffs = [_diff(n, eager32[n], t, kind) for n, (t, kind) in compiled32.items()]
    w = worst(diffs)
    if w is not None and w.ratio > 1.0:
        return eager32, (False, f"the compiled run differs from the same model run eagerly on "
                                f"tpu ({w.name}, {w.ratio:.3g}x the tolerance"
                                f"{', ' + w.note if w.note else ''})")
    return eager32, (True, f"the compiled run matches the eager tpu run (worst "
                           f"{w.ratio if w else 0.0:.2g}x the tolerance, {len(diffs)} tensors)")


def _audit_ops(case: Case) -> "OpAudit":
    """Runs the case's eval forward and training step (forward and backward) on tpu under the
    per-op precision audit (precision.py)."""
    from .precision import OpAudit
    torch.manual_seed(SEED)
    model = _build(case)
    quiet_randomness(model)
    model = model.to(torch.device("tpu"))
    inputs = to_device(_seeded_inputs(case.inputs), torch.device("tpu"))
    train_inputs = to_device(_seeded_inputs(case.train_inputs or case.inputs), torch.device("tpu"))
    audit = OpAudit()
    with audit:
        model.eval()
        with torch.no_grad():
            model(**inputs)
        model.train()
        torch.manual_seed(SEED)
        (case.loss or default_loss)(model(**train_inputs)).backward()
    return audit


def run_case(case: Case, mode: str = "eager") -> dict:
    """Runs one case; never raises (except KeyboardInterrupt/SystemExit). The record:
    zoo, name, mode, status, reason, phases, worst (for mismatches), fallback_ops, params,
    seconds; in compiled mode (`mode="compile"`, see _forward_and_train) also `compile`
    (DynamoStats.snapshot(): graphs, graph breaks and their reasons, recompiles, the tpu graph
    metrics) and `compile_phases` (the graphs compiled in each phase)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {MODES}")
    compiled = mode == "compile"
    t0 = time.time()
    rec: Dict[str, Any] = {"zoo": case.zoo, "name": case.name, "mode": mode, "status": None,
                           "reason": "", "phases": {}, **({"info": case.info} if case.info else {})}
    watch: List[FallbackWatch] = []
    stats: Optional[DynamoStats] = None
    try:
        if compiled and case.pipeline:
            raise Skip("compiled mode compiles a model's forward and training step; a pipeline "
                       "case runs in eager mode only")
        if compiled:
            stats = DynamoStats()
        keep32: Dict[str, Tuple[torch.Tensor, torch.Tensor, str]] = {}

        def keep_pair(name: str, c: torch.Tensor, t: torch.Tensor, kind: str) -> None:
            keep32[name] = (c.detach().clone(), t.detach().cpu(), kind)

        diffs = (_pipeline(case, rec, watch) if case.pipeline
                 else _forward_and_train(case, rec, watch, keep=keep_pair, compiled=compiled))
        if stats is not None:  # before the float64 check, which compiles graphs of its own
            rec["compile"] = stats.snapshot()
        fallback_ops: Dict[str, int] = {}
        for w in watch:
            for k, v in w.ops.items():
                fallback_ops[k] = fallback_ops.get(k, 0) + v
        fallback_count = sum(w.count for w in watch)
        if fallback_count and not fallback_ops:
            fallback_ops = {"(unnamed)": fallback_count}
        rec["fallback_ops"] = fallback_ops
        bad = [d for d in diffs if d.ratio > 1.0]
        rec["compared"] = len(diffs)
        rounding = False
        if bad and not case.pipeline:
            rounding, rec["float64_check"] = _rounding_check(case, keep32, bad, compiled)
        keep32.clear()
        if bad and rounding:
            wd = worst(bad)
            for k, v in rec["phases"].items():
                if v == "mismatch":
                    rec["phases"][k] = "pass: float32 rounding (float64 check)"
            rec["rounding"] = {"mismatched": len(bad), "worst": wd.as_dict()}
            rec["status"] = "fallback" if fallback_ops else "pass"
            rec["reason"] = (f"{len(bad)}/{len(diffs)} float32 tensors differ (worst {wd.name}, "
                             f"{wd.ratio:.3g}x the tolerance) by {rec['float64_check']}")
            if fallback_ops:
                rec["reason"] = "CPU fallback: " + ", ".join(sorted(fallback_ops)) + "; " + rec["reason"]
        elif bad:
            wd = worst(bad)
            rec["status"] = "mismatch"
            rec["worst"] = wd.as_dict()
            rec["mismatched"] = len(bad)
            rec["mismatched_tensors"] = [d.name for d in sorted(bad, key=lambda d: -d.ratio)[:10]]
            rec["reason"] = (f"{len(bad)}/{len(diffs)} tensors differ; worst {wd.name}: max abs err "
                             f"{wd.max_abs:.3g}, {wd.ratio:.3g}x the tolerance"
                             + (f" ({wd.note})" if wd.note else ""))
        elif fallback_ops:
            rec["status"] = "fallback"
            rec["reason"] = "CPU fallback: " + ", ".join(sorted(fallback_ops))
        else:
            rec["status"] = "pass"
        skipped = [f"{k} {v}" for k, v in rec["phases"].items() if v.startswith("skipped")]
        if skipped and rec["status"] == "pass":
            rec["reason"] = "; ".join(skipped + ([rec["reason"]] if rec["reason"] else []))
    except Skip as s:
        rec["status"] = "skipped"
        rec["reason"] = str(s)
    except _TpuError as e:
        rec["status"] = "error"
        rec["phase"] = e.phase
        cause = _compile_cause(e.exc)
        rec["reason"] = (first_line(cause) if cause is e.exc else
                         f"{type(e.exc).__name__}: {first_line(cause)}"[:400]) + _explained(cause)
        rec["where"] = where(cause)
        rec["phases"][e.phase] = "error"
        ops: Dict[str, int] = {}
        for w in watch:
            for k, v in w.ops.items():
                ops[k] = ops.get(k, 0) + v
        rec["fallback_ops"] = ops
    except Exception as e:  # a harness or zoo bug: still a record, named as such
        rec["status"] = "error"
        rec["phase"] = "harness"
        rec["reason"] = first_line(e)
        rec["where"] = where(e)
    finally:
        if stats is not None:
            if "compile" not in rec:  # an error: what Dynamo did up to it
                try:
                    rec["compile"] = stats.snapshot()
                except Exception:
                    pass
            stats.close()
    rec["seconds"] = round(time.time() - t0, 2)
    return rec
