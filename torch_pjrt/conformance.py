"""Op conformance harness: every OpInfo of PyTorch's ``op_db`` run on the "tpu" device and
compared against the CPU.

Only ``op_db`` (the OpInfo database shipped in the torch wheel) is used, as data: its sample
inputs, supported dtypes and tolerance overrides. The comparison logic is our own.

Run ``python -m torch_pjrt.conformance --help``. Each (op, dtype) case ends as one of
  P pass, F fail (values/dtypes/shapes differ), B fallback (the CPU-fallback counter moved while
  the op ran on tpu), E error (tpu raised, CPU did not), S skipped (the OpInfo does not support
  the dtype on CPU), U unsupported (float64/complex64 columns only: tpu raised for a plugin
  reason, e.g. the dtype is not available).
Samples inside a case are classified the same way; the case takes the worst sample
(E > F > B > P). Random ops are compared on shapes and dtypes only, plus same-seed
reproducibility on tpu. The report is rewritten every few ops, labelled "partial run" until the
run completes, so an interrupted run still leaves an honest report.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

import torch_pjrt  # noqa: F401  (registers the "tpu" device)
from torch_pjrt import _C

TPU = torch.device("tpu")

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "float64": torch.float64,
    "complex64": torch.complex64,
}
DEFAULT_DTYPES = ("float32", "bfloat16", "int64", "float64", "complex64")
# Columns whose tpu errors are reported as U (the plugin may not implement the dtype at all).
PLUGIN_OPTIONAL_DTYPES = ("float64", "complex64")

# Default tolerances for bfloat16 when the OpInfo has none of its own.
BF16_TOL = (1.6e-2, 1e-2)  # (rtol, atol)

RANDOM_KEYWORDS = ("rand", "normal", "bernoulli", "dropout", "multinomial", "uniform",
                   "exponential", "geometric", "cauchy", "fractional_max_pool", "rrelu")
# Ops that draw random numbers only when called with training=True (dropout inside).
RANDOM_WHEN_TRAINING = ("multi_head_attention",)
# Ops whose values are unspecified (uninitialised memory): shape/dtype only, no seed check.
UNINITIALISED_PREFIXES = ("empty", "new_empty")

REASON_MAX = 200
# The first sample of each case also runs noncontiguous, through the in-place variant and
# through out= (where the OpInfo has them); --no-variants turns this off.
VARIANTS = True

# Severity used to pick one status for a case out of its samples.
SEVERITY = {"P": 0, "B": 1, "F": 2, "E": 3, "U": 3}


def fallback_count() -> int:
    return int(_C.metrics()["cpu_fallbacks"])


def fallback_ops() -> Dict[str, int]:
    try:
        return dict(_C.fallback_ops())
    except Exception:  # noqa: BLE001  (older extension without per-op counts)
        return {}


def short(msg: str, limit: int = REASON_MAX) -> str:
    msg = " ".join(str(msg).split())
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Applies fn to every tensor nested in lists/tuples/dicts (namedtuples kept as such)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(map_tensors(x, fn) for x in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(x, fn) for x in obj)
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    return obj


def iter_tensors(obj: Any) -> Iterable[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from iter_tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from iter_tensors(x)


def _tensor_to_tpu(t: torch.Tensor) -> torch.Tensor:
    """A tpu tensor with t's values and t's layout: for a view into a larger storage (the
    noncontiguous samples, partial views) the whole storage is copied and the same view taken,
    so ops that depend on strides, offsets or the storage (as_strided, view_as_complex's
    checks, contiguity checks) see what the CPU saw."""
    t = t.detach()
    if t.layout != torch.strided or t.is_conj() or t.is_neg():
        return t.to(TPU)
    n = t.untyped_storage().nbytes() // t.element_size()
    if t.is_contiguous() and t.storage_offset() == 0 and n == t.numel():
        return t.to(TPU)
    whole = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (n,), (1,))
    return whole.to(TPU).as_strided(t.size(), t.stride(), t.storage_offset())


def to_tpu(obj: Any) -> Any:
    return map_tensors(obj, _tensor_to_tpu)


def to_cpu(obj: Any) -> Any:
    return map_tensors(obj, lambda t: t.detach().to("cpu"))


def is_random(op) -> bool:
    name = op.name.lower()
    return any(k in name for k in RANDOM_KEYWORDS) or is_uninitialised(op)


def sample_is_random(op, sample) -> bool:
    """A random op, or a sample that switches on dropout (dropout_p > 0, training=True)."""
    if is_random(op):
        return True
    for k, v in sample.kwargs.items():
        if "dropout" in k and isinstance(v, (int, float)) and v > 0:
            return True
    return bool(sample.kwargs.get("training")) and any(
        w in op.name for w in RANDOM_WHEN_TRAINING)


def is_uninitialised(op) -> bool:
    return op.name.startswith(UNINITIALISED_PREFIXES) or op.name in ("empty_like",)


def op_tolerance(op, dtype: torch.dtype) -> Optional[Tuple[float, float]]:
    """(rtol, atol) from the OpInfo's toleranceOverride/precisionOverride decorators for dtype
    (the loosest over all its tests), or None when it defines none."""
    rtol = atol = None
    for info in getattr(op, "decorators", ()) or ():
        for dec in getattr(info, "decorators", [info]):
            d = getattr(dec, "d", None)
            if not isinstance(d, dict) or dtype not in d:
                continue
            tol = d[dtype]
            if hasattr(tol, "atol"):  # toleranceOverride: tol(atol, rtol)
                atol = max(atol or 0.0, float(tol.atol))
                rtol = max(rtol or 0.0, float(tol.rtol))
            elif isinstance(tol, (int, float)):  # precisionOverride: atol only
                atol = max(atol or 0.0, float(tol))
    if rtol is None and atol is None:
        return None
    if rtol is None or atol is None:
        # assert_close needs both; pair the given one with the default of the other.
        drt, dat = default_tolerance(dtype)
        rtol = drt if rtol is None else rtol
        atol = dat if atol is None else atol
    return rtol, atol


def default_tolerance(dtype: torch.dtype) -> Tuple[float, float]:
    if dtype == torch.bfloat16:
        return BF16_TOL
    # assert_close's defaults per dtype (float32: 1.3e-6/1e-5; float64: 1e-7/1e-7, ...).
    from torch.testing._comparison import default_tolerances

    return default_tolerances(dtype)


def compare(actual: Any, expected: Any, tol: Optional[Tuple[float, float]],
            shape_only: bool) -> Optional[str]:
    """None when actual (already on CPU) matches expected, else a short mismatch message."""
    a_t, e_t = list(iter_tensors(actual)), list(iter_tensors(expected))
    if len(a_t) != len(e_t):
        return f"output structure differs: {len(a_t)} tensors vs {len(e_t)} expected"
    for i, (a, e) in enumerate(zip(a_t, e_t)):
        if a.dtype != e.dtype:
            return f"dtype mismatch at output {i}: {a.dtype} vs expected {e.dtype}"
        if a.shape != e.shape:
            return f"shape mismatch at output {i}: {tuple(a.shape)} vs expected {tuple(e.shape)}"
    if shape_only:
        return None
    if not a_t:  # non-tensor results (numbers, bools, sizes)
        return None if actual == expected else f"value {actual!r} vs expected {expected!r}"
    for i, (a, e) in enumerate(zip(a_t, e_t)):
        kw = {}
        if tol is not None:
            kw = {"rtol": tol[0], "atol": tol[1]}
        try:
            torch.testing.assert_close(a, e, equal_nan=True, check_device=False,
                                       check_layout=False, check_stride=False, **kw)
        except AssertionError as err:
            return f"output {i}: " + short(str(err).replace("\n", " "))
    return None


@dataclass
class SampleResult:
    status: str  # P F B E U
    reason: str = ""


@dataclass
class CaseResult:
    op: str
    dtype: str
    status: str  # P F B E S U
    reason: str = ""
    samples: int = 0
    fallback_ops: Dict[str, int] = field(default_factory=dict)


def _processed(sample, out: Any) -> Any:
    """The sample's own output post-processing (OpInfo's output_process_fn_grad): for ops whose
    outputs are defined only up to a choice (the signs of eigenvectors and singular vectors) it
    maps them to what is unique. PyTorch compares devices through it too."""
    fn = getattr(sample, "output_process_fn_grad", None)
    return fn(out) if fn is not None else out


def _clone(obj: Any) -> Any:
    return map_tensors(obj, lambda t: t.clone())


def _empty_like_result(result: Any, device) -> Any:
    """Fresh out= destinations shaped like a functional result (a tensor or a tuple of them)."""
    if isinstance(result, torch.Tensor):
        return torch.empty(result.shape, dtype=result.dtype, device=device)
    if isinstance(result, (tuple, list)) and all(isinstance(r, torch.Tensor) for r in result):
        return tuple(torch.empty(r.shape, dtype=r.dtype, device=device) for r in result)
    return None


def _variant_call(op, variant: str, expected_functional: Any):
    """(callable(inp, args, kwargs, device) -> what to compare) for a sample variant, or None
    when the OpInfo has no such variant. In-place variants are compared on the mutated input;
    out= variants on the destinations they were given, which must also be what they return."""
    if variant == "inplace":
        fn = op.inplace_variant
        if fn is None:
            return None

        def call(inp, args, kwargs, device):
            res = fn(inp, *args, **kwargs)
            if isinstance(inp, torch.Tensor) and res is not inp and (
                    not isinstance(res, torch.Tensor) or res.data_ptr() != inp.data_ptr()):
                raise AssertionError("the in-place variant did not return its input")
            return inp
        return call
    if variant == "out":
        if not getattr(op, "supports_out", False):
            return None
        if _empty_like_result(expected_functional, "cpu") is None:
            return None

        def call(inp, args, kwargs, device):
            out = _empty_like_result(expected_functional, device)
            res = op.op(inp, *args, out=out, **kwargs)
            outs = out if isinstance(out, tuple) else (out,)
            ress = tuple(res) if isinstance(res, (tuple, list)) else (res,)
            if len(ress) != len(outs) or any(r.data_ptr() != o.data_ptr() for r, o in zip(ress, outs)):
                raise AssertionError("the out= variant did not return its out tensors")
            return out
        return call
    return lambda inp, args, kwargs, device: op.op(inp, *args, **kwargs)


def run_sample(op, sample, dtype: torch.dtype, dtype_name: str,
               variant: str = "", expected_functional: Any = None) -> Tuple[SampleResult, Dict]:
    """Runs one sample on CPU and on tpu and classifies the tpu result. variant "" calls the
    op; "inplace" and "out" call those variants (expected_functional: the op's CPU result, to
    shape out= destinations); the sample may be a noncontiguous copy."""
    call = _variant_call(op, variant, expected_functional)
    if call is None:
        return SampleResult("P"), {}
    tol = op_tolerance(op, dtype)
    if tol is None and dtype == torch.bfloat16:
        tol = BF16_TOL
    random = sample_is_random(op, sample)
    cpu_inp, cpu_args, cpu_kwargs = sample.input, sample.args, sample.kwargs
    inp, args, kwargs = to_tpu(cpu_inp), to_tpu(cpu_args), to_tpu(cpu_kwargs)
    if isinstance(kwargs, dict) and kwargs.get("device") is not None:
        # factory samples name the CPU as their device: on the tpu side they must build there
        kwargs = dict(kwargs, device=TPU)
    if variant == "inplace":
        cpu_inp = _clone(cpu_inp)
    cpu_exc = None
    try:
        torch.manual_seed(0)
        expected = call(cpu_inp, cpu_args, cpu_kwargs, "cpu")
    except Exception as exc:  # noqa: BLE001
        cpu_exc = exc
    before, before_ops = fallback_count(), fallback_ops()
    try:
        torch.manual_seed(0)
        try:
            actual = call(_clone(inp) if variant == "inplace" else inp, args, kwargs, TPU)
        except RuntimeError as exc:
            # Some ops take index tensors that must stay on the CPU (e.g. tensor_split's
            # tensor_indices_or_sections): retry with only the input moved.
            if "to be on cpu" not in str(exc):
                raise
            args, kwargs = cpu_args, cpu_kwargs
            torch.manual_seed(0)
            actual = call(_clone(inp) if variant == "inplace" else inp, args, kwargs, TPU)
        if isinstance(kwargs, dict) and kwargs.get("device") == TPU:
            off = [t.device for t in iter_tensors(actual) if t.device.type != "tpu"]
            if off:
                raise AssertionError(f"a factory op asked for tpu built on {off[0]}")
        actual_cpu = to_cpu(actual)  # forces execution: errors surface here
    except Exception as exc:  # noqa: BLE001
        moved = {k: v - before_ops.get(k, 0) for k, v in fallback_ops().items()
                 if v != before_ops.get(k, 0)}
        if cpu_exc is not None:
            if type(exc) is type(cpu_exc):
                return SampleResult("P"), moved
            return SampleResult("F", f"raised {type(exc).__name__} where CPU raises "
                                     f"{type(cpu_exc).__name__}: {short(exc, 120)}"), moved
        status = "U" if dtype_name in PLUGIN_OPTIONAL_DTYPES else "E"
        return SampleResult(status, f"{type(exc).__name__}: {short(exc)}"), moved
    moved = {k: v - before_ops.get(k, 0) for k, v in fallback_ops().items()
             if v != before_ops.get(k, 0)}
    fell_back = fallback_count() != before
    if cpu_exc is not None:
        return SampleResult("F", f"no error where CPU raises {type(cpu_exc).__name__}: "
                                 f"{short(cpu_exc, 120)}"), moved
    try:
        # (out= and in-place variants yield the op's outputs too: same post-processing)
        actual_cpu, expected = _processed(sample, actual_cpu), _processed(sample, expected)
    except Exception as exc:  # noqa: BLE001
        return SampleResult("F", f"output post-processing failed: {short(exc)}"), moved
    mismatch = compare(actual_cpu, expected, tol, shape_only=random)
    if mismatch is None and random and is_random(op) and not is_uninitialised(op):
        # same seed twice on tpu must give the same values
        try:
            torch.manual_seed(0)
            again = to_cpu(call(_clone(inp) if variant == "inplace" else inp, args, kwargs, TPU))
            rep = compare(again, actual_cpu, (0.0, 0.0), shape_only=False)
            if rep is not None:
                mismatch = "not reproducible under the same seed: " + rep
        except Exception as exc:  # noqa: BLE001
            mismatch = f"second run under the same seed raised {type(exc).__name__}"
    if mismatch is not None:
        return SampleResult("F", mismatch), moved
    if fell_back:
        return SampleResult("B", "cpu fallback: " + ", ".join(sorted(moved)) if moved
                            else "cpu fallback"), moved
    return SampleResult("P"), moved


def run_case(op, dtype_name: str, n_samples: int) -> CaseResult:
    dtype = DTYPES[dtype_name]
    try:
        supported = op.supported_dtypes("cpu")
    except Exception as exc:  # noqa: BLE001
        return CaseResult(op.name, dtype_name, "E", f"supported_dtypes failed: {short(exc)}")
    if dtype not in supported:
        return CaseResult(op.name, dtype_name, "S")
    worst = SampleResult("P")
    n = 0
    all_moved: Dict[str, int] = {}

    def attempt(sample, variant: str = "", label: str = "", expected=None) -> None:
        nonlocal worst
        try:
            res, moved = run_sample(op, sample, dtype, dtype_name, variant, expected)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001  (harness must survive anything)
            res, moved = SampleResult("E", f"harness: {type(exc).__name__}: {short(exc)}"), {}
        for k, v in moved.items():
            all_moved[k] = all_moved.get(k, 0) + v
        if label and res.reason:
            res = SampleResult(res.status, f"{label}: {res.reason}")
        if SEVERITY[res.status] > SEVERITY[worst.status]:
            worst = res

    try:
        samples = op.sample_inputs("cpu", dtype)
        for sample in samples:
            if n >= n_samples:
                break
            n += 1
            attempt(sample)
            if n == 1 and VARIANTS:
                # the first sample also runs noncontiguous, in place and with out=
                try:
                    nc = sample.noncontiguous()
                except Exception:  # noqa: BLE001 - a sample that cannot be made noncontiguous
                    nc = None
                if nc is not None:
                    attempt(nc, "", "noncontiguous")
                try:
                    torch.manual_seed(0)
                    functional = op.op(sample.input, *sample.args, **sample.kwargs)
                except Exception:  # noqa: BLE001 - CPU rejects it: out= has no shape to take
                    functional = None
                attempt(sample, "inplace", "in-place variant")
                if functional is not None:
                    attempt(sample, "out", "out= variant", functional)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001  (sample generation itself failed)
        if n == 0:
            return CaseResult(op.name, dtype_name, "E",
                              f"sample_inputs failed: {type(exc).__name__}: {short(exc)}")
    if n == 0:
        return CaseResult(op.name, dtype_name, "S", "no samples")
    return CaseResult(op.name, dtype_name, worst.status, worst.reason, n, all_moved)


def _grad_loss(out: Any) -> Optional[torch.Tensor]:
    terms = []
    for t in iter_tensors(out):
        if t.requires_grad and (t.is_floating_point() or t.is_complex()):
            terms.append(torch.view_as_real(t).sum() if t.is_complex() else t.sum())
    if not terms:
        return None
    return sum(terms[1:], terms[0])


def run_grad_case(op, n_samples: int = 2) -> Optional[CaseResult]:
    """float32 gradients of sum(outputs) w.r.t. the inputs that require grad, tpu vs CPU.
    None when the op is not differentiable in float32 on CPU."""
    if not getattr(op, "supports_autograd", False):
        return None
    try:
        if torch.float32 not in op.supported_backward_dtypes("cpu"):
            return None
    except Exception:  # noqa: BLE001
        pass
    tol = op_tolerance(op, torch.float32)
    worst = SampleResult("P")
    n = 0
    try:
        for sample in op.sample_inputs("cpu", torch.float32, requires_grad=True):
            if n >= n_samples:
                break
            n += 1
            res = _grad_sample(op, sample, tol)
            if SEVERITY[res.status] > SEVERITY[worst.status]:
                worst = res
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001
        if n == 0:
            return CaseResult(op.name, "grad", "E", f"sample_inputs failed: {short(exc)}")
        worst = SampleResult("E", f"harness: {type(exc).__name__}: {short(exc)}")
    if n == 0:
        return None
    return CaseResult(op.name, "grad", worst.status, worst.reason, n)


def _grad_sample(op, sample, tol) -> SampleResult:
    all_in = [sample.input, sample.args, sample.kwargs]
    leaves = [t for t in iter_tensors(all_in) if t.requires_grad]
    if not leaves:
        return SampleResult("P")
    try:
        torch.manual_seed(0)
        out = _processed(sample, op.op(sample.input, *sample.args, **sample.kwargs))
        loss = _grad_loss(out)
        if loss is None:
            return SampleResult("P")
        expected = torch.autograd.grad(loss, leaves, allow_unused=True)
    except Exception:  # noqa: BLE001  (CPU cannot differentiate this sample: not counted)
        return SampleResult("P")
    ids = {id(t) for t in leaves}
    tpu_leaves: List[torch.Tensor] = []

    def mk(t: torch.Tensor) -> torch.Tensor:
        d = _tensor_to_tpu(t)  # same layout as on the CPU (a leaf: nothing above needs grad)
        if id(t) in ids:
            d.requires_grad_(True)
            tpu_leaves.append(d)
        return d

    inp, args, kwargs = map_tensors(all_in, mk)
    before = fallback_count()
    try:
        torch.manual_seed(0)
        try:
            out = op.op(inp, *args, **kwargs)
        except RuntimeError as exc:
            if "to be on cpu" not in str(exc):
                raise
            # index tensors that must stay on the CPU (see run_sample): keep the
            # arguments that need no grad there
            keep = lambda t: t if id(t) not in ids else mk(t)  # noqa: E731
            tpu_leaves.clear()
            inp = mk(sample.input) if isinstance(sample.input, torch.Tensor) else \
                map_tensors(sample.input, mk)
            args, kwargs = map_tensors([sample.args, sample.kwargs], keep)
            torch.manual_seed(0)
            out = op.op(inp, *args, **kwargs)
        loss = _grad_loss(_processed(sample, out))
        if loss is None:
            return SampleResult("F", "tpu output does not require grad")
        actual = torch.autograd.grad(loss, tpu_leaves, allow_unused=True)
        actual = [None if g is None else g.cpu() for g in actual]
    except Exception as exc:  # noqa: BLE001
        return SampleResult("E", f"{type(exc).__name__}: {short(exc)}")
    for i, (a, e) in enumerate(zip(actual, expected)):
        if (a is None) != (e is None):
            return SampleResult("F", f"grad {i}: None on one side only")
        if a is None:
            continue
        msg = compare(a, e, tol, shape_only=sample_is_random(op, sample))
        if msg is not None:
            return SampleResult("F", f"grad {i}: {msg}")
    if fallback_count() != before:
        return SampleResult("B", "cpu fallback in forward/backward")
    return SampleResult("P")


def select_ops(ops_filter: Optional[str], limit: Optional[int]):
    from torch.testing._internal.common_methods_invocations import op_db

    ops = list(op_db)
    if ops_filter:
        wanted = [w.strip() for w in ops_filter.split(",") if w.strip()]
        exact = [o for o in ops if any(o.full_name == w or o.name == w for w in wanted)]
        # exact names win; otherwise substring matches
        names_hit = {w for w in wanted if any(o.full_name == w or o.name == w for o in ops)}
        sub = [o for o in ops if any(w in o.full_name for w in wanted if w not in names_hit)]
        ops = [o for o in ops if o in exact or o in sub]
    total = len(ops)
    if limit is not None:
        ops = ops[:limit]
    return ops, total


@dataclass
class Run:
    dtypes: Sequence[str]
    cases: List[CaseResult] = field(default_factory=list)
    grads: List[CaseResult] = field(default_factory=list)
    ops_done: int = 0
    order: List[str] = field(default_factory=list)  # OpInfo full names in op_db order


def run(ops, dtypes: Sequence[str], n_samples: int, grad: bool = True,
        progress: Optional[Callable[[Run, int], None]] = None, verbose: bool = False,
        start: Tuple[int, int] = (0, 0),
        on_begin: Optional[Callable[[int, int], None]] = None,
        on_result: Optional[Callable[[CaseResult], None]] = None) -> Run:
    """Runs every (op, stage) from start on; stages are the dtypes, then "grad".
    on_begin(op index, stage index) is called before each stage (crash bookkeeping)."""
    result = Run(dtypes=list(dtypes), order=[o.full_name for o in ops])
    stages = list(dtypes) + (["grad"] if grad and "float32" in dtypes else [])
    for i, op in enumerate(ops):
        if i < start[0]:
            continue
        t0 = time.time()
        for j, dn in enumerate(stages):
            if i == start[0] and j < start[1]:
                continue
            if on_begin is not None:
                on_begin(i, j)
            try:
                case = run_case(op, dn, n_samples) if dn != "grad" else run_grad_case(op)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: BLE001
                case = CaseResult(op.full_name, dn, "E", f"harness: {short(exc)}")
            if case is None:  # no gradient case for this op
                continue
            case.op = op.full_name
            (result.grads if dn == "grad" else result.cases).append(case)
            if on_result is not None:
                on_result(case)
        result.ops_done = i + 1
        if verbose:
            row = " ".join(c.status for c in result.cases if c.op == op.full_name)
            print(f"[{i + 1}/{len(ops)}] {op.full_name}: {row} ({time.time() - t0:.1f}s)",
                  file=sys.stderr, flush=True)
        if progress is not None:
            progress(result, i)
    return result


def run_supervised(argv_base: List[str], ops, dtypes: Sequence[str], grad: bool,
                   progress: Callable[[Run, int], None], jsonl: str) -> Run:
    """Runs the harness in worker subprocesses so that a crashing op (segfault, abort) is
    recorded as an E case ("crashed") and the run continues with the next stage."""
    import json
    import subprocess

    stages = list(dtypes) + (["grad"] if grad and "float32" in dtypes else [])
    result = Run(dtypes=list(dtypes), order=[o.full_name for o in ops])
    start = (0, 0)
    while start[0] < len(ops):
        open(jsonl, "w").close()
        cmd = [sys.executable, "-m", "torch_pjrt.conformance", *argv_base,
               "--worker-jsonl", jsonl, "--start", f"{start[0]},{start[1]}"]
        proc = subprocess.Popen(cmd)
        pos = 0
        current = start
        while True:
            rc = proc.poll()
            with open(jsonl) as f:
                f.seek(pos)
                chunk = f.read()
            complete_lines = chunk[: chunk.rfind("\n") + 1]
            pos += len(complete_lines.encode())
            for line in complete_lines.splitlines():
                rec = json.loads(line)
                if "begin" in rec:
                    current = tuple(rec["begin"])
                    if current[0] > result.ops_done:
                        result.ops_done = current[0]
                        progress(result, current[0] - 1)
                else:
                    case = CaseResult(**rec)
                    (result.grads if case.dtype == "grad" else result.cases).append(case)
            if rc is not None:
                break
            time.sleep(0.2)
        if rc == 0:
            result.ops_done = len(ops)
            break
        i, j = current
        crash = CaseResult(ops[i].full_name, stages[j], "E",
                           f"crashed the process (exit status {rc})")
        (result.grads if stages[j] == "grad" else result.cases).append(crash)
        print(f"worker crashed in {ops[i].full_name} {stages[j]} (rc {rc}); continuing",
              file=sys.stderr, flush=True)
        start = (i, j + 1) if j + 1 < len(stages) else (i + 1, 0)
    return result


def totals(cases: Sequence[CaseResult]) -> Dict[str, int]:
    c = collections.Counter(x.status for x in cases)
    return {k: c.get(k, 0) for k in "PFBEUS"}


def pass_rate(t: Dict[str, int]) -> float:
    attempted = sum(t[k] for k in "PFBEU")
    return t["P"] / attempted if attempted else 0.0


def failure_class(reason: str) -> str:
    """Groups reasons by their first words (numbers, quoted and bracketed words dropped; an
    aten::op name counts as one word, so fallbacks group by the op that fell back)."""
    words = []
    for w in reason.replace(": ", " : ").split():
        if "::" not in w and (any(ch.isdigit() for ch in w)
                              or w.startswith(("'", '"', "(", "["))):
            continue
        words.append(w)
        if len(words) == 6:
            break
    return " ".join(words) or "(no reason)"


def render(res: Run, meta: Dict[str, str], total_ops: int, complete: bool) -> str:
    dts = list(res.dtypes)
    order = {name: k for k, name in enumerate(res.order)}
    res.cases.sort(key=lambda c: order.get(c.op, len(order)))
    res.grads.sort(key=lambda c: order.get(c.op, len(order)))
    L: List[str] = ["# Op conformance against PyTorch's OpInfo database", ""]
    if not complete or res.ops_done < total_ops:
        L += [f"**partial run: first {res.ops_done} of {total_ops} OpInfos**", ""]
    L += [
        "Generated by `torch_pjrt/conformance.py` (do not edit by hand).", "",
        f"- date: {meta['date']}",
        f"- torch: {torch.__version__}",
        f"- plugin: `{meta['identity']}`",
        f"- command: `{meta['command']}`",
        f"- samples per (op, dtype): {meta['samples']}; runtime so far: {meta['elapsed']}",
        "",
        "Legend: P pass, F fail (values/dtype/shape differ from CPU), B CPU fallback happened "
        "(values may match), E error on tpu only, U unsupported (float64/complex64: tpu error), "
        "S skipped (OpInfo does not support the dtype on CPU). Random ops: shapes/dtypes and "
        "same-seed reproducibility only. Outputs pass through the sample's own "
        "output_process_fn_grad before comparison and before the gradient loss (it makes "
        "sign-ambiguous outputs such as eigenvectors comparable), as PyTorch's cross-device "
        "comparison does. "
        + ("Besides its samples, each case runs its first sample noncontiguous, through the "
           "in-place variant (compared on the mutated input, which must be returned) and "
           "through out= (compared on the destinations, which must be returned), where the "
           "OpInfo has them; a reason starting with the variant's name comes from that run."
           if VARIANTS else "Variants (noncontiguous, in-place, out=) not run."), "",
        "## Totals (forward)", "",
        "| dtype | pass | fail | fallback | error | unsupported | skipped | pass rate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for dn in dts:
        t = totals([c for c in res.cases if c.dtype == dn])
        L.append(f"| {dn} | {t['P']} | {t['F']} | {t['B']} | {t['E']} | {t['U']} | {t['S']} | "
                 f"{pass_rate(t):.1%} |")
    t = totals(res.cases)
    L.append(f"| **all** | {t['P']} | {t['F']} | {t['B']} | {t['E']} | {t['U']} | {t['S']} | "
             f"{pass_rate(t):.1%} |")
    g = totals(res.grads)
    L += ["", "## Gradients (float32, first 2 samples, loss = sum of outputs)", "",
          f"pass {g['P']}, fail {g['F']}, fallback {g['B']}, error {g['E']} "
          f"(pass rate {pass_rate(g):.1%} of {sum(g[k] for k in 'PFBE')} ops)", ""]

    bad = [c for c in res.cases + res.grads if c.status in "FBEU"]
    classes = collections.Counter(f"{c.status} {failure_class(c.reason)}" for c in bad)
    L += ["## Largest failure classes", "", "| count | status + first words of the reason |",
          "|---|---|"]
    for cls, n in classes.most_common(25):
        L.append(f"| {n} | {cls.replace('|', '/')} |")

    fb = collections.Counter()
    for c in res.cases:
        for k, v in c.fallback_ops.items():
            fb[k] += 1
    if fb:
        L += ["", "## Ops that fell back to the CPU (number of cases)", "",
              ", ".join(f"`{k}` ({v})" for k, v in fb.most_common())]

    L += ["", "## Per-op results", "", "| op | " + " | ".join(dts) + " | grad |",
          "|---|" + "---|" * (len(dts) + 1)]
    by_op: Dict[str, Dict[str, str]] = collections.OrderedDict()
    for c in res.cases:
        by_op.setdefault(c.op, {})[c.dtype] = c.status
    for c in res.grads:
        by_op.setdefault(c.op, {})["grad"] = c.status
    for op, cells in by_op.items():
        L.append(f"| {op} | " + " | ".join(cells.get(d, "-") for d in dts + ["grad"]) + " |")

    L += ["", "## Failures", "", "One line per failing case: `op` dtype status: reason "
          "(identical reasons of one op across dtypes are grouped).", ""]
    grouped: Dict[Tuple[str, str, str], List[str]] = collections.OrderedDict()
    for c in bad:
        grouped.setdefault((c.op, c.status, c.reason), []).append(c.dtype)
    for (op, st, reason), dl in grouped.items():
        L.append(f"- `{op}` {','.join(dl)} {st}: {reason or '(no message)'}")
    L.append("")
    return "\n".join(L)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch_pjrt.conformance", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", help="comma list of OpInfo names (exact) or substrings")
    p.add_argument("--dtypes", default=",".join(DEFAULT_DTYPES),
                   help="comma list among " + ",".join(DTYPES))
    p.add_argument("--samples", type=int, default=8, help="samples per (op, dtype)")
    p.add_argument("--out", default="docs/conformance.md")
    p.add_argument("--limit", type=int, help="only the first K OpInfos (after --ops)")
    p.add_argument("--no-grad", action="store_true", help="skip the gradient cases")
    p.add_argument("--no-variants", action="store_true",
                   help="skip the noncontiguous, in-place and out= runs of each case's first "
                        "sample")
    p.add_argument("--checkpoint", type=int, default=10,
                   help="rewrite the report every K ops (0: only at the end)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--json", help="also dump every case as JSON to this path")
    p.add_argument("--in-process", action="store_true",
                   help="no worker subprocess (a crashing op then ends the run)")
    p.add_argument("--worker-jsonl", help=argparse.SUPPRESS)
    p.add_argument("--start", default="0,0", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    global VARIANTS
    VARIANTS = not a.no_variants
    dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    for d in dtypes:
        if d not in DTYPES:
            p.error(f"unknown dtype {d}")
    ops, total = select_ops(a.ops, a.limit)
    t0 = time.time()
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "identity": _C.identity(),
        "command": "python -m torch_pjrt.conformance " + " ".join(
            sys.argv[1:] if argv is None else argv),
        "samples": str(a.samples),
        "elapsed": "",
    }

    def write(res: Run, complete: bool) -> None:
        meta["elapsed"] = f"{time.time() - t0:.0f} s"
        with open(a.out, "w") as f:
            f.write(render(res, meta, total, complete))

    def progress(res: Run, i: int) -> None:
        if a.checkpoint and (i + 1) % a.checkpoint == 0:
            write(res, complete=False)

    if a.worker_jsonl:  # worker mode: stream results as JSON lines for the supervisor
        import dataclasses
        import json

        out = open(a.worker_jsonl, "a")

        def emit(obj) -> None:
            out.write(json.dumps(obj) + "\n")
            out.flush()

        st = tuple(int(x) for x in a.start.split(","))
        run(ops, dtypes, a.samples, grad=not a.no_grad, verbose=a.verbose, start=st,
            on_begin=lambda i, j: emit({"begin": [i, j]}),
            on_result=lambda c: emit(dataclasses.asdict(c)))
        return 0
    if a.in_process:
        res = run(ops, dtypes, a.samples, grad=not a.no_grad, progress=progress,
                  verbose=a.verbose)
    else:
        base = [x for x in (sys.argv[1:] if argv is None else list(argv))
                if x != "--in-process"]
        res = run_supervised(base, ops, dtypes, not a.no_grad, progress,
                             os.path.join(tempfile.mkdtemp(prefix="conformance"), "w.jsonl"))
    write(res, complete=True)
    if a.json:
        import dataclasses
        import json

        with open(a.json, "w") as f:
            json.dump([dataclasses.asdict(c) for c in res.cases + res.grads], f)
    for dn in dtypes:
        t = totals([c for c in res.cases if c.dtype == dn])
        print(f"{dn}: {t} pass rate {pass_rate(t):.1%}")
    print(f"grad: {totals(res.grads)}")
    print(f"report written to {a.out} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
