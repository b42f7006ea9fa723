"""Where a compiled step's time goes: device time per program, host time in this backend, and
host time in Dynamo's and AOTAutograd's wrappers (``torch.tpu.step_profile()``).

::

    with torch.tpu.step_profile() as prof:
        for _ in range(5):
            with prof.step():
                train_step()
    print(prof.table())

Each ``prof.step()`` synchronizes before and after its body, so the steps do not overlap one
another; inside a step everything stays asynchronous. Three sources, joined on the step's window:

- **Device time per program** (the runtime's execution timeline, csrc/runtime/exec_profile.c):
  every execution's issue and completion times; a program's device time is its completion minus
  the later of its issue and the previous completion on its device. Programs are named by who
  issued them: a compiled graph's plan by its graph (``graph3_forward``), anything else
  ``eager``.
- **Host time in this backend**: the time inside the compiled graphs' runners (graph_runner.py:
  signature, plan run, outputs), a ``tpu_backend: <graph>`` range in PyTorch's profiler.
- **Host time in Dynamo's and AOTAutograd's wrappers**: PyTorch's profiler ranges that those
  wrappers open themselves (``TorchDynamo Cache Lookup``, the guard check of a compiled frame;
  ``Torch-Compiled Region``, the frame's bytecode; ``CompiledFunction`` and
  ``CompiledFunctionBackward``, AOTAutograd's autograd function). Each instant of the step goes to
  the innermost range open then (so the backend's time inside a wrapper is the backend's, and an
  autograd engine task run inside a compiled region, at a graph break, is not the wrapper's); an
  aten op's range counts as its enclosing range's.

What is left of the step's host time is *other host*: eager ops between graphs, the autograd
engine outside compiled functions, the optimizer's and the user's Python. *Waiting* is the
synchronize at the end of the step: device work the host had run ahead of. PyTorch's profiler
costs host time of its own (a few microseconds per range), which lands in these columns: wall
times to compare against other systems come from runs without the profile (benchmarks/).
"""
from __future__ import annotations

import contextlib
import heapq
import time
from dataclasses import dataclass, field

import torch

from ..device import _C

# The StepProfile being recorded (graph_runner.py checks it on every call), or None.
active = None

BACKEND_RANGE = "tpu_backend: "
# The ranges Dynamo and AOTAutograd open around the code they run (torch 2.13-2.15): Dynamo's
# guard check and compiled frame, whose own time is theirs but whose eager calls (the code at a
# graph break) are not, and AOTAutograd's, whose eager calls (output views, allocations) are.
DYNAMO_RANGES = ("TorchDynamo Cache Lookup", "Torch-Compiled Region")
AOT_RANGES = ("CompiledFunction", "CompiledFunctionBackward",
              "AOTDispatcher Runtime Wrapper Prologue")
WRAPPER_RANGES = DYNAMO_RANGES + AOT_RANGES
STEP_RANGE = "tpu_step#"


def _category(event, memo: dict) -> str:
    """backend / wrapper / other for a profiler event: the backend's and the wrappers' own ranges
    are theirs; any other event (an aten op, an optimizer's range) is the backend's or the
    wrappers' when its nearest such ancestor is the backend or AOTAutograd, and other host time
    otherwise (run by the user's code, also at a graph break inside a compiled frame)."""
    key = id(event)
    if key not in memo:
        name = event.name
        if name.startswith(BACKEND_RANGE):
            memo[key] = "backend"
        elif name.startswith(WRAPPER_RANGES):
            memo[key] = "wrapper"
        else:
            up = event.cpu_parent
            while up is not None and not up.name.startswith((BACKEND_RANGE,) + WRAPPER_RANGES):
                up = up.cpu_parent
            if up is None or up.name.startswith(DYNAMO_RANGES):
                memo[key] = "other"
            else:
                memo[key] = _category(up, memo)
    return memo[key]


def _depth(event) -> int:
    depth = 0
    while event.cpu_parent is not None:
        event = event.cpu_parent
        depth += 1
    return depth


def classify_ms(spans) -> dict[str, float]:
    """{category: ms} over [(start_us, end_us, category[, depth])]: each instant goes to the
    innermost span covering it (the latest start; among equal starts the earliest end, then the
    deepest), whatever its thread: the host thread waits in an enclosing range while the autograd
    engine's thread runs inside it. One sweep over the spans' ends, the open spans in a heap
    keyed innermost first."""
    out = {"backend": 0.0, "wrapper": 0.0, "other": 0.0}
    by_start = sorted(spans)
    cuts = sorted({t for span in spans for t in span[:2]})
    open_spans: list = []
    k = 0
    for a, b in zip(cuts, cuts[1:]):
        while k < len(by_start) and by_start[k][0] <= a:
            s0, s1, cat, *depth = by_start[k]
            heapq.heappush(open_spans, (-s0, s1, -(depth[0] if depth else 0), cat))
            k += 1
        while open_spans and open_spans[0][1] < b:  # ended: no longer covers [a, b]
            heapq.heappop(open_spans)
        if open_spans:
            out[open_spans[0][3]] += (b - a) / 1e3
    return out


def device_times(records) -> dict[str, list[float]]:
    """{label: [device ms of each execution]} from timeline records (device, label, issued_ns,
    done_ns): per device in issue order, an execution's device time runs from the later of its
    issue and the previous completion to its own completion."""
    out: dict[str, list[float]] = {}
    by_device: dict[int, list] = {}
    for r in records:
        by_device.setdefault(r[0], []).append(r)
    for recs in by_device.values():
        recs.sort(key=lambda r: r[2])
        prev_done = None
        for _, label, issued, done in recs:
            start = issued if prev_done is None else max(issued, prev_done)
            out.setdefault(label, []).append(max(0, done - start) / 1e6)
            prev_done = done if prev_done is None else max(prev_done, done)
    return out


@dataclass
class Step:
    """One step's attribution (milliseconds)."""
    wall_ms: float
    device_ms: float
    backend_host_ms: float
    wrapper_host_ms: float
    other_host_ms: float
    waiting_ms: float
    programs: dict[str, list[float]] = field(default_factory=dict)  # label -> device ms each

    def row(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in ("wall_ms", "device_ms", "backend_host_ms",
                                              "wrapper_host_ms", "other_host_ms", "waiting_ms")}


class StepProfile:
    """Context manager; see the module's docstring."""

    def __init__(self):
        self.steps: list[Step] = []
        self.dropped = 0
        self._windows: list[tuple[int, int, int]] = []  # (start, body end, synchronized) ns
        self._profiler = None

    def __enter__(self):
        global active
        if active is not None:
            raise RuntimeError("torch.tpu.step_profile(): already recording one")
        torch.tpu.synchronize()
        _C._exec_profile_enable(True)
        self._profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self._profiler.__enter__()
        active = self
        return self

    @contextlib.contextmanager
    def step(self):
        if active is not self:
            raise RuntimeError("StepProfile.step() outside its `with` block")
        torch.tpu.synchronize()
        start = time.monotonic_ns()
        with torch.profiler.record_function(f"{STEP_RANGE}{len(self._windows)}"):
            yield
        body_end = time.monotonic_ns()
        torch.tpu.synchronize()
        self._windows.append((start, body_end, time.monotonic_ns()))

    def __exit__(self, *exc):
        global active
        active = None
        try:
            self._profiler.__exit__(*exc)
        finally:
            _C._exec_profile_enable(False)
        records, self.dropped = _C._exec_profile_take()
        if exc[0] is None:
            self._attribute(records, self._profiler.events())
        return False

    def _attribute(self, records, events) -> None:
        steps = sorted((e for e in events if e.name.startswith(STEP_RANGE)),
                       key=lambda e: int(e.name[len(STEP_RANGE):]))
        for (start, body_end, synced), step_event in zip(self._windows, steps):
            lo, hi = step_event.time_range.start, step_event.time_range.end
            memo: dict = {}
            spans = [(e.time_range.start, e.time_range.end, _category(e, memo), _depth(e))
                     for e in events if e.time_range.start >= lo and e.time_range.end <= hi]
            host = classify_ms(spans)
            programs = device_times([r for r in records if start <= r[2] < synced])
            body_ms = (body_end - start) / 1e6
            self.steps.append(Step(
                wall_ms=(synced - start) / 1e6,
                device_ms=sum(sum(v) for v in programs.values()),
                backend_host_ms=host["backend"],
                wrapper_host_ms=host["wrapper"],
                other_host_ms=max(0.0, body_ms - host["backend"] - host["wrapper"]),
                waiting_ms=(synced - body_end) / 1e6,
                programs=programs))

    def summary(self, skip: int = 0) -> dict:
        """Medians over the steps after the first `skip`: the step columns and, per program,
        executions per step and median device ms per execution."""
        import statistics

        steps = self.steps[skip:]
        if not steps:
            return {"steps": 0}
        cols = {k: statistics.median(s.row()[k] for s in steps) for k in steps[0].row()}
        labels = sorted({lab for s in steps for lab in s.programs})
        programs = {}
        for lab in labels:
            runs = [ms for s in steps for ms in s.programs.get(lab, [])]
            programs[lab] = {"runs_per_step": len(runs) / len(steps),
                             "median_ms": statistics.median(runs),
                             "total_ms_per_step": sum(runs) / len(steps)}
        return {"steps": len(steps), **cols, "programs": programs}

    def table(self, skip: int = 0) -> str:
        """Markdown: the summary's step columns, then one row per program."""
        s = self.summary(skip)
        if not s["steps"]:
            return "(no steps recorded)"
        cols = ("wall_ms", "device_ms", "backend_host_ms", "wrapper_host_ms", "other_host_ms",
                "waiting_ms")
        out = ["| steps | " + " | ".join(c.replace("_ms", " (ms)").replace("_", " ")
                                         for c in cols) + " |",
               "|---" * (len(cols) + 1) + "|",
               f"| {s['steps']} | " + " | ".join(f"{s[c]:.3f}" for c in cols) + " |", "",
               "| program | runs per step | median device ms | device ms per step |",
               "|---|---|---|---|"]
        for lab, p in sorted(s["programs"].items(), key=lambda kv: -kv[1]["total_ms_per_step"]):
            out.append(f"| {lab} | {p['runs_per_step']:g} | {p['median_ms']:.3f} | "
                       f"{p['total_ms_per_step']:.3f} |")
        return "\n".join(out)


def step_profile() -> StepProfile:
    return StepProfile()
