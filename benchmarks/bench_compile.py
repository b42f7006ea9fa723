"""torch.compile(backend="tpu") benchmark: the tiny-GPT training step (forward, backward, AdamW,
host->device batch copy, loss.item()) compiled on tpu, against the tpu eager modes (Strict,
DeferAndFuse), CPU eager and CPU Inductor, in one run; and the time to the first compiled step
in a fresh process with a cold and a warm persistent cache.

Usage: python benchmarks/bench_compile.py [--out docs/performance.md] [--quick]
Prints a markdown section; with --out, replaces that section of the file (or appends it).
Threads: PyTorch's defaults (torch.get_num_threads() is printed); nothing else should run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import torch

import torch_pjrt  # noqa: F401  (autoload does this too; explicit for a plain checkout)
from torch_pjrt import _models

TPU = torch.device("tpu")
BEGIN, END = "<!-- bench_compile: begin -->", "<!-- bench_compile: end -->"


def _setup(device, n, layers):
    data = _models.CharDataset(_models.zen_corpus(), block=32)
    g = torch.Generator().manual_seed(0)
    batches = [data.batch(8, g) for _ in range(n)]
    model = _models.init_weights(_models.TinyGPT(data.vocab, layers=layers), seed=0).to(device)
    # capturable: AdamW keeps its step counters on the device, so the compiled optimizer
    # graph has no CPU inputs (on the CPU it changes nothing)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, capturable=device.type == "tpu")
    return model, opt, batches


def step_times(kind: str, steps: int, warmup: int, layers: int):
    """Median step time (ms), first-step time (s) and per-step counters for one way of running."""
    device = torch.device("cpu") if kind.startswith("cpu") else TPU
    model, opt, batches = _setup(device, warmup + steps, layers)

    def step(x, y):
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        return loss

    backend = {"compiled": "tpu", "cpu_inductor": "inductor"}.get(kind)
    if backend:
        torch._dynamo.reset()
        step = torch.compile(step, backend=backend)
    mode = {"strict": "strict", "defer_and_fuse": "defer_and_fuse"}.get(kind, "strict")
    torch.tpu.set_eager_mode(mode)
    times, first = [], None
    try:
        for i, (x, y) in enumerate(batches):
            if i == warmup:
                m0 = torch.tpu.metrics()
            t0 = time.perf_counter_ns()
            step(x.to(device), y.to(device)).item()
            dt = time.perf_counter_ns() - t0
            if i == 0:
                first = dt / 1e9
            if i >= warmup:
                times.append(dt)
    finally:
        torch.tpu.set_eager_mode("strict")
    m1 = torch.tpu.metrics()
    per_step = {k: (m1[k] - m0[k]) / steps for k in
                ("executions", "compiles", "cpu_fallbacks", "graph_runs", "defer_ops")}
    return statistics.median(times) / 1e6, first, per_step


FIRST_STEP = """
import time
t_start = time.perf_counter()
import torch
from torch_pjrt import _models
t_import = time.perf_counter()
data = _models.CharDataset(_models.zen_corpus(), block=32)
x, y = data.batch(8, torch.Generator().manual_seed(0))
model = _models.init_weights(_models.TinyGPT(data.vocab, layers={layers}), seed=0).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, capturable=True)
@torch.compile(backend="tpu")
def step(x, y):
    opt.zero_grad()
    loss = model(x, y)
    loss.backward()
    opt.step()
    return loss
t0 = time.perf_counter()
step(x.to("tpu"), y.to("tpu")).item()
t1 = time.perf_counter()
m = torch.tpu.metrics()
print("RESULT", t1 - t_start, t1 - t0, m["compiles"], m["compile_ns"] / 1e9, m["disk_cache_hits"],
      m["graph_captures"])
"""


def first_step(layers: int, cache_dir: str):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(FIRST_STEP.format(layers=layers))],
                       capture_output=True, text=True, timeout=900,
                       env={**os.environ, "TORCH_PJRT_CACHE_DIR": cache_dir})
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")]
    if r.returncode != 0 or not line:
        raise RuntimeError(f"first-step run failed:\n{r.stderr[-2000:]}")
    total, step_s, compiles, compile_s, hits, captures = line[0].split()[1:]
    return float(total), float(step_s), int(compiles), float(compile_s), int(hits), int(captures)


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="replace (or append) this section in the markdown file")
    p.add_argument("--quick", action="store_true", help="fewer steps")
    args = p.parse_args(argv)
    steps, warmup = (10, 3) if args.quick else (30, 5)

    kinds = ("compiled", "strict", "defer_and_fuse", "cpu_eager", "cpu_inductor")
    names = {"compiled": "tpu, torch.compile(backend=\"tpu\")", "strict": "tpu, Strict eager",
             "defer_and_fuse": "tpu, DeferAndFuse eager", "cpu_eager": "CPU eager",
             "cpu_inductor": "CPU, torch.compile(backend=\"inductor\")"}
    rows = {}
    for layers in (2, 6):
        for kind in kinds:
            rows[(layers, kind)] = step_times(kind, steps, warmup, layers)
    firsts = {}
    for layers in (2, 6):
        with tempfile.TemporaryDirectory(prefix="bench_compile_cache_") as d:
            cold = first_step(layers, d)
            warm = [first_step(layers, d) for _ in range(3)]
        firsts[layers] = (cold, sorted(warm)[1])

    load = os.getloadavg()
    lines = [
        BEGIN,
        "# torch.compile: tiny-GPT training step",
        "",
        f"Measured by `benchmarks/bench_compile.py` (torch {torch.__version__}, PJRT "
        f"`{torch.tpu.get_device_name()}`, {os.cpu_count()} cores, torch.get_num_threads() = "
        f"{torch.get_num_threads()}, load average at the end {load[0]:.1f}/{load[1]:.1f}/"
        f"{load[2]:.1f}). One step: host->device batch copy, zero_grad, forward, backward, "
        "AdamW, loss.item(); the whole step function is compiled (model and optimizer). Median "
        f"of {steps} steps after {warmup} warm-up steps; all rows in one process, one after the "
        "other. Batch 8, block 32, d 64, 4 heads.",
        "",
        "| layers | how | step (ms) | vs CPU eager | speedup over Strict | vs Inductor | programs run per step | graph runs per step | first step (s) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for layers in (2, 6):
        cpu = rows[(layers, "cpu_eager")][0]
        strict = rows[(layers, "strict")][0]
        ind = rows[(layers, "cpu_inductor")][0]
        for kind in kinds:
            ms, first, c = rows[(layers, kind)]
            tpu_counts = not kind.startswith("cpu")
            lines.append(
                f"| {layers} | {names[kind]} | {ms:.2f} | {ms / cpu:.2f}x | {strict / ms:.2f}x | "
                f"{ms / ind:.2f}x | {c['executions']:.0f} | "
                f"{c['graph_runs']:.0f} | {first:.1f} |" if tpu_counts else
                f"| {layers} | {names[kind]} | {ms:.2f} | {ms / cpu:.2f}x | {strict / ms:.2f}x | "
                f"{ms / ind:.2f}x | | | {first:.1f} |")
    lines += [
        "",
        "`vs CPU eager` and `vs Inductor` are time ratios (below 1 is faster); `speedup over "
        "Strict` is Strict's step time over this row's. `first step` includes Dynamo tracing, "
        "AOTAutograd and compiling (compiled rows) in this warm process.",
        "",
        "## Time to the first compiled training step in a fresh process",
        "",
        "From interpreter start to the first step's `loss.item()`, one process per run; the warm "
        "runs reuse the cold run's TORCH_PJRT_CACHE_DIR (median of 3). `step` is the first "
        "call alone (Dynamo + AOTAutograd + capture + program compile or load).",
        "",
        "| layers | cache | total (s) | first call (s) | programs compiled | compile time (s) | compile per program (s) | disk-cache hits | graphs captured |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for layers, (cold, warm) in firsts.items():
        for label, r in (("cold", cold), ("warm", warm)):
            total, step_s, compiles, compile_s, hits, captures = r
            per = f"{compile_s / compiles:.2f}" if compiles else ""
            lines.append(f"| {layers} | {label} | {total:.2f} | {step_s:.2f} | {compiles} | "
                         f"{compile_s:.2f} | {per} | {hits} | {captures} |")
        lines.append(f"| {layers} | warm / cold | {warm[0] / cold[0]:.0%} | "
                     f"{warm[1] / cold[1]:.0%} | | | | | |")
    lines += ["", END, ""]
    report = "\n".join(lines)
    print(report)
    if args.out:
        old = open(args.out).read() if os.path.exists(args.out) else ""
        if BEGIN in old and END in old:
            head, rest = old.split(BEGIN, 1)
            new = head + report.rstrip("\n") + rest.split(END, 1)[1]
        else:
            new = old.rstrip("\n") + "\n\n" + report
        with open(args.out, "w") as f:
            f.write(new)
    return report


if __name__ == "__main__":
    main()
