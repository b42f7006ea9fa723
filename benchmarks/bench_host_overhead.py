"""Host overhead per eager op (issue 12 item 2), in one process: a cache-hit 8x8 add as the
Python-return time of 1,000 calls (median of 15 blocks), the tiny-op chain `x = x * 0.5 + b` in
Strict and defer_and_fuse (per op, median of blocks 5-12 of 2,000 ops, each block ending in
`x.cpu()`), and the tiny-GPT training step in both modes (median of 30 steps after 5).

    .venv/bin/python benchmarks/bench_host_overhead.py [--label NAME]

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


def chain_us(mode: str) -> float:
    torch.tpu.set_eager_mode(mode)
    b = torch.randn(8, 8, device="tpu")
    x = torch.randn(8, 8, device="tpu")
    ts = []
    try:
        for _ in range(12):
            t0 = time.perf_counter_ns()
            for _ in range(1000):
                x = x * 0.5 + b
            x.cpu()
            ts.append((time.perf_counter_ns() - t0) / 2000 / 1e3)
    finally:
        torch.tpu.set_eager_mode("strict")
    return statistics.median(ts[4:])


def gpt_ms(mode: str) -> float:
    return bench_eager.train_steps(bench_eager._gpt_setup, torch.device("tpu"), 30, 5, mode)[0]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--label", default="this build")
    a = p.parse_args(argv)
    r = {"add dispatch (us)": dispatch_us(), "chain strict (us/op)": chain_us("strict"),
         "chain defer_and_fuse (us/op)": chain_us("defer_and_fuse"),
         "GPT step strict (ms)": gpt_ms("strict"), "GPT step defer_and_fuse (ms)": gpt_ms("defer_and_fuse")}
    print(a.label + ": " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()), flush=True)
    return r


if __name__ == "__main__":
    main()
