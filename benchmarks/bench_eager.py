"""Eager-mode benchmark of the tpu device against PyTorch's CPU eager backend.

Measures, in one run:
  1. per-op dispatch latency on an executable-cache hit (a small add), as the time until Python
     gets control back and as the time until the result is ready (torch.tpu.synchronize);
  2. first-compile latency for common ops: the first synchronized call at a shape never used
     before, minus the synchronized cache-hit time of the same call;
  3. training-step time (forward, backward, AdamW, loss.item()) of the tiny GPT and of an
     elementwise-heavy GELU-MLP block with residuals and layer norm, in the three eager modes
     (strict, defer_and_fuse, debug) and on CPU eager.

Usage: python benchmarks/bench_eager.py [--out docs/performance.md] [--quick]
Prints a markdown report to stdout and, with --out, writes it to that file.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import torch_pjrt  # noqa: F401  (autoload does this too; explicit for a plain checkout)
from torch_pjrt import _models

TPU = torch.device("tpu")


def sync(device) -> None:
    if torch.device(device).type == "tpu":
        torch.tpu.synchronize()


def median_us(samples_ns) -> float:
    return statistics.median(samples_ns) / 1e3


# --- 1. dispatch latency -----------------------------------------------------------------------


def dispatch_latency(iters: int):
    rows = {}
    for device in (TPU, torch.device("cpu")):
        a = torch.randn(8, 8, device=device)
        b = torch.randn(8, 8, device=device)
        for _ in range(50):  # compile and warm up
            c = a + b
        sync(device)
        returned = []
        for _ in range(iters):
            t0 = time.perf_counter_ns()
            c = a + b
            returned.append(time.perf_counter_ns() - t0)
        sync(device)
        synced = []
        for _ in range(iters):
            t0 = time.perf_counter_ns()
            c = a + b
            sync(device)
            synced.append(time.perf_counter_ns() - t0)
        del c
        rows[device.type] = (median_us(returned), median_us(synced))
    return rows


# --- 2. first-compile latency ------------------------------------------------------------------


def _ops():
    """name -> (make inputs for a size parameter n, op). Sizes differ per op and from anything
    else in the process, so the first call compiles."""
    r = lambda *s: torch.randn(*s, device=TPU)  # noqa: E731
    return {
        "add": (lambda n: (r(n, n + 1), r(n, n + 1)), lambda a, b: a + b),
        "mul (scalar)": (lambda n: (r(n, n + 2),), lambda a: a * 3.0),
        "exp": (lambda n: (r(n, n + 3),), torch.exp),
        "relu": (lambda n: (r(n, n + 4),), torch.relu),
        "sum(dim=1)": (lambda n: (r(n, n + 5),), lambda a: a.sum(1)),
        "matmul": (lambda n: (r(n, n + 6), r(n + 6, n)), torch.matmul),
        "softmax": (lambda n: (r(n, n + 7),), lambda a: a.softmax(-1)),
        "layer_norm": (lambda n: (r(n, n + 8),), lambda a: F.layer_norm(a, (a.shape[-1],))),
        "conv2d 3x3": (lambda n: (r(2, 3, n, n), r(8, 3, 3, 3)), lambda x, w: F.conv2d(x, w, padding=1)),
        "cat": (lambda n: (r(n, n + 9), r(n, n + 9)), lambda a, b: torch.cat([a, b], 1)),
        "transpose+contiguous": (lambda n: (r(n, n + 10),), lambda a: a.t().contiguous()),
        "index_select": (lambda n: (r(n, n + 11), torch.arange(0, n, 2, device=TPU)),
                         lambda a, i: a.index_select(0, i)),
    }


def compile_latency(base: int, reps: int):
    """Per op: the first call at a new shape (its Python return, then synchronized), a cache
    hit, and the runtime's counters for the first call."""
    rows = []
    for k, (name, (make, op)) in enumerate(_ops().items()):
        args = make(base + 3 * k)
        sync(TPU)
        m0 = torch.tpu.metrics()
        t0 = time.perf_counter_ns()
        try:
            out = op(*args)
            ret = time.perf_counter_ns() - t0
            sync(TPU)
        except Exception as e:  # noqa: BLE001 - an op the device cannot run yet: report it
            rows.append((name, f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"))
            continue
        first = time.perf_counter_ns() - t0
        m1 = torch.tpu.metrics()
        hits = []
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            out = op(*args)
            sync(TPU)
            hits.append(time.perf_counter_ns() - t0)
        del out
        hit = median_us(hits)
        rows.append((name, ret / 1e3, first / 1e3, hit, first / 1e3 - hit,
                     m1["compiles"] - m0["compiles"], (m1["compile_ns"] - m0["compile_ns"]) / 1e3,
                     m1["cpu_fallbacks"] - m0["cpu_fallbacks"]))
    return rows


def burst_latency(base: int):
    """Every op of _ops() at a new shape, called back to back, then one synchronize: the
    Python time to issue them all and the time until all results are ready (independent
    programs compile in parallel when background compiles are on)."""
    made = [(make(base + 3 * k), op) for k, (make, op) in enumerate(_ops().values())]
    sync(TPU)
    m0 = torch.tpu.metrics()
    t0 = time.perf_counter_ns()
    outs = [op(*args) for args, op in made]
    issued = time.perf_counter_ns() - t0
    sync(TPU)
    done = time.perf_counter_ns() - t0
    m1 = torch.tpu.metrics()
    del outs
    return issued / 1e6, done / 1e6, m1["compiles"] - m0["compiles"]


# A loop over sizes (a test suite, a notebook): each op at sizes 1001..1024, one after another,
# each synchronized. The elementwise ones run the program of their size bucket (1024: compiled
# at the first size, bucket.h); softmax has a program per shape.
SWEEP_OPS = {
    "mul+add": lambda a: a * 3.0 + 1.0,
    "exp": torch.exp,
    "cumsum": lambda a: a.cumsum(0),
    "max": lambda a: a.max(),
    "softmax (exact shapes)": lambda a: a.softmax(0),
}


def size_sweep(device, first: int = 1001, last: int = 1024):
    """Per op: the median and max synchronized first call at each new size after the first,
    and the programs compiled over the whole sweep."""
    rows = []
    for name, op in SWEEP_OPS.items():
        times, compiles = [], 0
        for n in range(first, last + 1):
            a = torch.randn(n, device=device)
            sync(device)
            m0 = torch.tpu.metrics()["compiles"] if device.type == "tpu" else 0
            t0 = time.perf_counter_ns()
            op(a)
            sync(device)
            if n > first:
                times.append((time.perf_counter_ns() - t0) / 1e6)
            if device.type == "tpu":
                compiles += torch.tpu.metrics()["compiles"] - m0
        rows.append((name, statistics.median(times), max(times), compiles))
    return rows


def _pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


# --- 3. training steps in each eager mode --------------------------------------------------------


def _gpt_setup(device, n):
    data = _models.CharDataset(_models.zen_corpus(), block=32)
    g = torch.Generator().manual_seed(0)
    batches = [data.batch(8, g) for _ in range(n)]
    model = _models.init_weights(_models.TinyGPT(data.vocab), seed=0).to(device)
    return model, batches, lambda m, x, y: m(x, y)


def _gelu_setup(device, n):
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(64, 128, generator=g), torch.randn(64, generator=g))
               for _ in range(n)]
    model = _models.init_weights(_models.GeluMLPBlock(), seed=1).to(device)
    return model, batches, lambda m, x, y: F.mse_loss(m(x), y)


WORKLOADS = {"Tiny GPT (batch 8, block 32)": _gpt_setup,
             "GELU-MLP block (4 x pre-norm GELU MLP + residual, 64 x 128)": _gelu_setup}


def train_steps(setup, device, steps: int, warmup: int, mode: str = "strict"):
    """Median step time (ms) and the runtime counters per step after warm-up. The mode is the
    process default, so autograd's worker thread runs the backward pass in it too."""
    model, batches, loss_fn = setup(device, warmup + steps)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    if device.type == "tpu":
        torch.tpu.set_eager_mode(mode)
    times = []
    try:
        for i, (x, y) in enumerate(batches):
            if i == warmup:
                m0 = torch.tpu.metrics()
            t0 = time.perf_counter_ns()
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            loss = loss_fn(model, x, y)
            loss.backward()
            opt.step()
            loss.item()
            if i >= warmup:
                times.append(time.perf_counter_ns() - t0)
    finally:
        if device.type == "tpu":
            torch.tpu.set_eager_mode("strict")
    m1 = torch.tpu.metrics()
    per_step = {k: (m1[k] - m0[k]) / steps for k in
                ("executions", "compiles", "cpu_fallbacks", "defer_ops")}
    return statistics.median(times) / 1e6, per_step


# --- report ------------------------------------------------------------------------------------


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="also write the markdown report to this file")
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = p.parse_args(argv)
    iters = 300 if args.quick else 2000
    steps = 10 if args.quick else 30

    disp = dispatch_latency(iters)
    # first calls with compiles in the op, then in the background (Strict's default), each at
    # shapes of its own; then the same for a burst of new ops before one synchronize
    threads = torch_pjrt._C._compile_threads()
    comp, burst = {}, {}
    for label, n, base in (("in the op", 0, 40), ("background", threads or 2, 80)):
        torch_pjrt._C._set_compile_threads(n)
        comp[label] = compile_latency(base, 20 if args.quick else 50)
        burst[label] = burst_latency(base + 80)
    torch_pjrt._C._set_compile_threads(threads)
    sweep = {"tpu": size_sweep(TPU), "cpu": size_sweep(torch.device("cpu"))}
    train = {}
    for name, setup in WORKLOADS.items():
        rows = {mode: train_steps(setup, TPU, steps, 5, mode)
                for mode in ("strict", "defer_and_fuse", "debug")}
        rows["cpu"] = train_steps(setup, torch.device("cpu"), steps, 5)
        train[name] = rows

    load = os.getloadavg()
    lines = [
        "# Eager performance: tpu (PJRT) vs CPU eager",
        "",
        f"Measured by `benchmarks/bench_eager.py` on {platform.node() or 'this machine'}: "
        f"torch {torch.__version__}, PJRT device kind `{torch.tpu.get_device_name()}` "
        f"({torch_pjrt._C.platform_name()} {torch_pjrt._C.platform_version()}), "
        f"{os.cpu_count()} CPU cores, load average at the end {load[0]:.1f}/{load[1]:.1f}/"
        f"{load[2]:.1f} (1/5/15 min). Both backends run on the same CPU cores, so ratios "
        "measure the device path's overhead, not accelerator speed.",
        "",
        "## Dispatch latency on a cache hit (8x8 float32 add, median of "
        f"{iters} calls)",
        "",
        "| backend | Python return (us) | synchronized (us) |",
        "|---|---:|---:|",
        f"| tpu | {disp['tpu'][0]:.1f} | {disp['tpu'][1]:.1f} |",
        f"| CPU eager | {disp['cpu'][0]:.1f} | {disp['cpu'][1]:.1f} |",
        f"| ratio tpu/CPU | {disp['tpu'][0] / disp['cpu'][0]:.1f}x | "
        f"{disp['tpu'][1] / disp['cpu'][1]:.1f}x |",
        "",
        "## First-call latency (first call at a new shape)",
        "",
        "Each op once with its program compiled in the op (background compiles off: "
        "`torch_pjrt._C._set_compile_threads(0)`), once with Strict's background compiles "
        f"({threads or 2} threads), at shapes of its own. `return` is the call's Python time, "
        "`synced` until its result is ready; `first - hit` the synchronized first call beyond a "
        "cache hit; `programs` and `compile` are the runtime's counters for the first call.",
        "",
        "| op | compiles | return (ms) | synced (ms) | cache hit (us) | first - hit (ms) | programs | compile (ms) | CPU fallbacks |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, rows in comp.items():
        for row in rows:
            if len(row) == 2:
                lines.append(f"| {row[0]} | {label} | failed: {row[1]} | | | | | | |")
                continue
            name, ret, first, hit, extra, progs, cns, fb = row
            lines.append(f"| {name} | {label} | {ret / 1e3:.1f} | {first / 1e3:.1f} | {hit:.0f} | "
                         f"{extra / 1e3:.1f} | {progs} | {cns / 1e3:.1f} | {fb} |")
    lines += ["", "| compiles | median return (ms) | p90 return (ms) | median synced (ms) | "
              "p90 synced (ms) | burst: issue all (ms) | burst: all ready (ms) | burst programs |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label, rows in comp.items():
        ok = [r for r in rows if len(r) != 2]
        rets = [r[1] / 1e3 for r in ok]
        syncs = [r[2] / 1e3 for r in ok]
        issued, done, progs = burst[label]
        lines.append(f"| {label} | {statistics.median(rets):.1f} | {_pct(rets, 0.9):.1f} | "
                     f"{statistics.median(syncs):.1f} | {_pct(syncs, 0.9):.1f} | {issued:.1f} | "
                     f"{done:.1f} | {progs} |")
    lines += [
        "",
        "## A loop over sizes (each op at 1001..1024 elements, synchronized; Strict)",
        "",
        "The first size compiles; `first call` is the median / max synchronized call at each "
        "later size, all new shapes. Elementwise ops, 1-D scans and max run their size bucket's "
        "program (bucket.h); softmax compiles each shape.",
        "",
        "| op | tpu first call, median (ms) | max (ms) | programs compiled (24 sizes) | CPU (ms) |",
        "|---|---:|---:|---:|---:|",
    ]
    for (name, med, worst, progs), (_, cpu_med, _, _) in zip(sweep["tpu"], sweep["cpu"]):
        lines.append(f"| {name} | {med:.2f} | {worst:.2f} | {progs} | {cpu_med:.3f} |")
    lines += [
        "",
        f"## Training step in each eager mode (median of {steps} steps after 5 warm-up steps; "
        "forward, backward, AdamW, host->device batch copy and loss.item())",
        "",
        "Per-step counters after warm-up: `programs run` is executions, `ops` the aten ops "
        "recorded by defer_and_fuse, `compiles` new programs (0 in steady state).",
        "",
        "| workload | mode | step (ms) | time vs CPU eager | speedup over strict | programs run | ops fused | compiles | CPU fallbacks |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, rows in train.items():
        cpu_ms = rows["cpu"][0]
        strict_ms = rows["strict"][0]
        for mode in ("strict", "defer_and_fuse", "debug"):
            ms, c = rows[mode]
            lines.append(f"| {name} | {mode} | {ms:.2f} | {ms / cpu_ms:.2f}x | "
                         f"{strict_ms / ms:.2f}x | {c['executions']:.0f} | "
                         f"{c['defer_ops']:.0f} | {c['compiles']:.0f} | {c['cpu_fallbacks']:.0f} |")
        lines.append(f"| {name} | CPU eager | {cpu_ms:.2f} | 1.00x | | | | | |")
    lines.append("")
    report = "\n".join(lines)
    print(report)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(report)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
