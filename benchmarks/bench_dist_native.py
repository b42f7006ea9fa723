"""all_reduce bus bandwidth between run_threads ranks: the native transport (one multi-device
program per call) against the Gloo-staged one, and a host memcpy of the same bytes.

    TORCH_PJRT_CPU_DEVICE_COUNT=4 python benchmarks/bench_dist_native.py [--iters 10] [--sizes 4K,64K,1M,16M,64M]

Each rank calls ``dist.all_reduce`` on a float32 tensor of the size and then
``torch.tpu.synchronize()`` (the program's completion on its device); rank 0's wall time per
call, median over ``--iters`` calls after one warm-up, gives the bus bandwidth
2 (n - 1) / n * bytes / time (NCCL's definition). The memcpy column is one host copy of the same
bytes (torch CPU tensors): what a single staging copy costs at that size. Measured, not
asserted; docs/distributed.md has the figures.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from torch_pjrt.distributed import run_threads, transport


def parse_size(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


def bench(world: int, nbytes: int, iters: int) -> tuple[str, float]:
    def fn(rank):
        x = torch.ones(nbytes // 4, device="tpu")
        dist.all_reduce(x)  # warm-up: compile, connect
        torch.tpu.synchronize()
        times = []
        for _ in range(iters):
            dist.barrier()
            torch.tpu.synchronize()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            torch.tpu.synchronize()
            times.append(time.perf_counter() - t0)
        return transport(), statistics.median(times)

    results = run_threads(fn, world)
    return results[0]


def memcpy_time(nbytes: int, iters: int) -> float:
    a = torch.ones(nbytes // 4)
    b = torch.empty_like(a)
    b.copy_(a)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        b.copy_(a)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--sizes", default="4K,64K,1M,16M,64M")
    ap.add_argument("--worlds", default="2,4")
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    print("| ranks | bytes | native busbw GB/s (ms) | staged busbw GB/s (ms) | host memcpy GB/s (ms) |")
    print("|---|---|---|---|---|")
    for world in [int(w) for w in args.worlds.split(",")]:
        for nbytes in sizes:
            iters = args.iters if nbytes <= (16 << 20) else max(3, args.iters // 2)
            row = []
            for choice in ("native", "staged"):
                os.environ["TORCH_PJRT_DIST_TRANSPORT"] = choice  # read at group creation
                got, t = bench(world, nbytes, iters)
                assert got == choice, (got, choice)
                bw = 2 * (world - 1) / world * nbytes / t / 1e9
                row.append(f"{bw:.2f} ({t * 1e3:.3f})")
            t = memcpy_time(nbytes, iters)
            row.append(f"{nbytes / t / 1e9:.2f} ({t * 1e3:.3f})")
            print(f"| {world} | {nbytes} | " + " | ".join(row) + " |", flush=True)
    os.environ.pop("TORCH_PJRT_DIST_TRANSPORT", None)


if __name__ == "__main__":
    main()
