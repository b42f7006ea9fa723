"""Host overhead per eager op (issue 12 item 2), in one process: a cache-hit 8x8 add as the
Python-return time of 1,000 calls (median of 15 blocks), the tiny-op chain `x = x * 0.5 + b` in
Strict and defer_and_fuse (per op, median of blocks 5-12 of 2,000 ops, each block ending in
`x.cpu()`; defer_and_fuse also counts the fused programs its graphs needed over all 12
blocks: memory-cache misses, compiled or loaded from the disk cache), the tiny-GPT training step in both modes (median of 30 steps after 5), and the first
op of a fresh process (`x * 2 + 1` on a tpu tensor, warm compile cache; its time and whether it
imported torch._dynamo).

    .venv/bin/python benchmarks/bench_host_overhead.py [--label NAME]
    .venv/bin/python benchmarks/bench_host_overhead.py --compare-memo 5
    .venv/bin/python benchmarks/bench_host_overhead.py --floors 5

--compare-memo N alternates the call memo on and off N times in one process (the same build,
csrc/bridge/call_memo.h) for the dispatch and chain figures and prints their medians.

--floors N puts the chain beside its floors, N rounds in one process: the same chain on CPU
eager (PyTorch's own cost per op, kernel included; its intra-op threads as set, see the
printed count) and the PJRT plugin's own cost per execution of an 8x8 add, bare and through our
runtime (benchmarks/plugin_execute_floor.c, built with make): a Strict op can not cost less
than the plugin's execution plus PyTorch's dispatch.

Prints one line of figures. To compare two builds, run it alternately with each on
PYTHONPATH (docs/performance.md, "Host overhead per op"); with a fresh TORCH_PJRT_CACHE_DIR
per build.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from torch_pjrt import _C as torch_pjrt_C

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_eager  # noqa: E402  (the tiny-GPT setup and training loop)


def dispatch_us() -> float:
    a = torch.randn(8, 8, device="tpu")
    b = torch.randn(8, 8, device="tpu")
    for _ in range(300):
        a + b
    torch.tpu.synchronize()
    ts = []
    for _ in range(15):
        t0 = time.perf_counter_ns()
        for _ in range(1000):
            a + b
        ts.append((time.perf_counter_ns() - t0) / 1000 / 1e3)
    torch.tpu.synchronize()
    return statistics.median(ts)


def chain_us(mode: str) -> tuple[float, int]:
    b = torch.randn(8, 8, device="tpu")
    x = torch.randn(8, 8, device="tpu")
    torch.tpu.synchronize()
    torch_pjrt_C._defer_reset_detector()
    torch.tpu.set_eager_mode(mode)
    ts = []
    # programs new to the process (memory-cache misses; compiled or loaded from the disk cache)
    c0 = torch.tpu.metrics()["cache_misses"]
    try:
        for _ in range(12):
            t0 = time.perf_counter_ns()
            for _ in range(1000):
                x = x * 0.5 + b
            x.cpu()
            ts.append((time.perf_counter_ns() - t0) / 2000 / 1e3)
    finally:
        torch.tpu.set_eager_mode("strict")
    return statistics.median(ts[4:]), torch.tpu.metrics()["cache_misses"] - c0


FIRST_OP = r"""
import sys, time
import torch
x = torch.ones(4, 4).to("tpu")
torch.tpu.synchronize()
t0 = time.perf_counter()
y = (x * 2 + 1).cpu()
print(time.perf_counter() - t0, "torch._dynamo" in sys.modules)
"""


def first_op_s() -> tuple[float, bool]:
    import subprocess
    import tempfile

    # (run outside the checkout: `python -c` puts the working directory first on sys.path,
    # which would shadow a build given on PYTHONPATH)
    for _ in range(2):  # the first run fills the compile cache; the second is measured
        out = subprocess.run([sys.executable, "-c", FIRST_OP], capture_output=True, text=True,
                             check=True, cwd=tempfile.gettempdir()).stdout.split()
    return float(out[0]), out[1] == "True"


def cpu_chain_us() -> float:
    b = torch.randn(8, 8)
    x = torch.randn(8, 8)
    ts = []
    for _ in range(12):
        t0 = time.perf_counter_ns()
        for _ in range(1000):
            x = x * 0.5 + b
        ts.append((time.perf_counter_ns() - t0) / 2000 / 1e3)
    return statistics.median(ts[4:])


def plugin_floor_us() -> tuple[float, float]:
    """(bare PJRT execute, pj_program_execute) medians in us, from the C program."""
    import subprocess

    from torch_pjrt import _plugins

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    exe = os.path.join(root, "build", "bench", "plugin_execute_floor")
    subprocess.run(["make", "-s", "-C", root, "PYTHON=" + sys.executable,
                    "build/bench/plugin_execute_floor"], check=True)
    env = dict(os.environ, TORCH_PJRT_PLUGIN=_plugins._cpu_plugin() or "")
    out = subprocess.run([exe], capture_output=True, text=True, check=True, env=env).stdout.split()
    return float(out[1]), float(out[4])


def floors(n: int) -> dict:
    runs: dict = {}
    print(f"CPU eager intra-op threads: {torch.get_num_threads()}", flush=True)
    for _ in range(n):
        bare, ours = plugin_floor_us()
        for k, v in (("chain CPU eager (us/op)", cpu_chain_us()),
                     ("chain strict (us/op)", chain_us("strict")[0]),
                     ("chain defer_and_fuse (us/op)", chain_us("defer_and_fuse")[0]),
                     ("plugin execute, bare (us)", bare),
                     ("plugin execute, through the runtime (us)", ours)):
            runs.setdefault(k, []).append(v)
    med = {k: statistics.median(v) for k, v in runs.items()}
    med["strict / defer_and_fuse"] = med["chain strict (us/op)"] / med["chain defer_and_fuse (us/op)"]
    print(", ".join(f"{k} {v:.2f}" for k, v in med.items()), flush=True)
    return med


def gpt_ms(mode: str) -> float:
    return bench_eager.train_steps(bench_eager._gpt_setup, torch.device("tpu"), 30, 5, mode)[0]


def compare_memo(n: int) -> dict:
    runs = {True: {}, False: {}}
    try:
        for _ in range(n):
            for on in (True, False):
                torch_pjrt_C._set_call_memo(on)
                for k, v in (("add dispatch (us)", dispatch_us()),
                             ("chain strict (us/op)", chain_us("strict")[0]),
                             ("chain defer_and_fuse (us/op)", chain_us("defer_and_fuse")[0])):
                    runs[on].setdefault(k, []).append(v)
    finally:
        torch_pjrt_C._set_call_memo(True)
    out = {}
    for on, figures in runs.items():
        med = {k: statistics.median(v) for k, v in figures.items()}
        out["memo" if on else "full path"] = med
        print(("memo on: " if on else "memo off (full path): ") +
              ", ".join(f"{k} {v:.2f}" for k, v in med.items()), flush=True)
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--label", default="this build")
    p.add_argument("--compare-memo", type=int, default=0, metavar="N")
    p.add_argument("--floors", type=int, default=0, metavar="N")
    a = p.parse_args(argv)
    if a.floors:
        return floors(a.floors)
    if a.compare_memo:
        return compare_memo(a.compare_memo)
    strict, _ = chain_us("strict")
    defer, programs = chain_us("defer_and_fuse")
    first, dynamo = first_op_s()
    r = {"add dispatch (us)": dispatch_us(), "chain strict (us/op)": strict,
         "chain defer_and_fuse (us/op)": defer, "defer chain programs": programs,
         "GPT step strict (ms)": gpt_ms("strict"), "GPT step defer_and_fuse (ms)": gpt_ms("defer_and_fuse"),
         "first op (s)": first, "first op imported dynamo": dynamo}
    print(a.label + ": " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                     for k, v in r.items()), flush=True)
    return r


if __name__ == "__main__":
    main()
