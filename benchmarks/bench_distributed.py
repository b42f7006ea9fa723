"""all_reduce bus bandwidth of tpu_dist (tpu tensors, staged through host memory over Gloo)
against the same Gloo all_reduce on CPU tensors, 2 ranks on this machine.

One process group "cpu:gloo,tpu:tpu_dist" per rank: CPU tensors go to a Gloo backend, tpu
tensors to tpu_dist (whose own internal Gloo backend moves the staged host copies), so both rows
use the same Gloo code over the same loopback transport. For each size the two kinds of call
(synchronous all_reduce(SUM) of one float32 tensor) alternate one by one and each call is timed,
so bursts of load from other processes on a shared machine fall on both alike. Time is the
mean per call (throughput, as nccl-tests reports it); bus bandwidth = bytes * 2(n-1)/n / time;
the ratio is Gloo's time over tpu_dist's (1.0: staging costs nothing), also given for the
medians, which such bursts shift least. A control runs the same Gloo call on a second CPU
tensor in the same rotation: its ratio to the first shows how far noise alone moves a ratio.

Usage: python benchmarks/bench_distributed.py [--out docs/distributed.md] [--quick]
Prints a markdown section; with --out, replaces that section of the file (or appends it).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torch_pjrt  # noqa: F401  (autoload does this too; explicit for a plain checkout)

from markdown_section import write_section  # benchmarks/ is the script's directory

BEGIN = "<!-- bench_distributed: begin -->"
END = "<!-- bench_distributed: end -->"
WORLD = 2
SIZES = [1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def human(n: int) -> str:
    return f"{n >> 20} MB" if n >= 1 << 20 else f"{n >> 10} KB"


def iters_for(nbytes: int, quick: bool) -> int:
    # Calls per round: 3 for the largest sizes, more for small ones (at most 50).
    n = max(3, min(50, (64 << 20) // max(nbytes, 1) // 8))
    return max(2, n // 4) if quick else n


def rank_main(rank: int, init: str, quick: bool, out_file: str) -> None:
    dist.init_process_group("cpu:gloo,tpu:tpu_dist", init_method=init, rank=rank,
                            world_size=WORLD)
    rounds = 3 if quick else 11
    results = []
    for nbytes in SIZES:
        numel = nbytes // 4
        # "ctl" is a second CPU tensor over the same Gloo: Gloo against itself, the noise floor.
        tensors = {"cpu": torch.zeros(numel), "tpu": torch.zeros(numel, device="tpu"),
                   "ctl": torch.zeros(numel)}
        iters = iters_for(nbytes, quick)
        for t in tensors.values():  # warm up: connections, programs, host blocks
            for _ in range(2):
                dist.all_reduce(t)
        torch.tpu.synchronize()
        times = {"cpu": [], "tpu": [], "ctl": []}
        dist.barrier()
        # One call of each kind in turn (the order rotates): load from other processes on a
        # shared machine comes in bursts, and fine interleaving spreads them over all kinds.
        orders = (("cpu", "tpu", "ctl"), ("tpu", "ctl", "cpu"), ("ctl", "cpu", "tpu"))
        for i in range(rounds * iters):
            for kind in orders[i % 3]:
                t = tensors[kind]
                t0 = time.perf_counter()
                dist.all_reduce(t)  # synchronous: returns once the result is written
                times[kind].append(time.perf_counter() - t0)
        results.append((nbytes, statistics.fmean(times["cpu"]), statistics.fmean(times["tpu"]),
                        statistics.median(times["cpu"]), statistics.median(times["tpu"]),
                        statistics.fmean(times["ctl"]), statistics.median(times["ctl"])))
    if rank == 0:
        with open(out_file, "w") as f:
            for row in results:
                f.write(" ".join(str(x) for x in row) + "\n")
    dist.destroy_process_group()


def bus_gbps(nbytes: int, seconds: float) -> float:
    return nbytes * 2 * (WORLD - 1) / WORLD / seconds / 1e9


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="replace (or append) this section in the markdown file")
    p.add_argument("--quick", action="store_true", help="fewer rounds and calls")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_distributed_") as d:
        out_file = os.path.join(d, "results.txt")
        mp.spawn(rank_main, args=("file://" + os.path.join(d, "store"), args.quick, out_file),
                 nprocs=WORLD)
        with open(out_file) as f:
            rows = [tuple(float(x) for x in line.split()) for line in f]
    load = os.getloadavg()
    lines = [
        BEGIN,
        "## Benchmark: all_reduce bus bandwidth, tpu_dist vs Gloo on CPU tensors",
        "",
        f"Measured by `python benchmarks/bench_distributed.py` (torch {torch.__version__}, "
        f"PJRT `{torch.tpu.get_device_name()}`, {WORLD} ranks on one machine with "
        f"{os.cpu_count()} cores, load average at the end {load[0]:.1f}/{load[1]:.1f}/"
        f"{load[2]:.1f}). Synchronous `all_reduce(SUM)` of one float32 tensor, CPU and tpu calls "
        f"alternating one by one, {3 if args.quick else 11} x 3 to 50 calls of each per size; "
        "time = mean per call, bus bandwidth = bytes x 2(n-1)/n / time, ratio = Gloo's time / "
        "tpu_dist's (bandwidth ratio). The control is the same Gloo call on a second CPU tensor "
        "in the same rotation: how far noise alone moves a ratio.",
        "",
        "| size | Gloo, CPU tensors (ms) | tpu_dist, tpu tensors (ms) | Gloo bus GB/s | tpu_dist bus GB/s | tpu / Gloo | tpu / Gloo, medians | control: Gloo / Gloo, means, medians |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for nbytes, c, t, cm, tm, k, km in rows:
        n = int(nbytes)
        lines.append(f"| {human(n)} | {c * 1e3:.3f} | {t * 1e3:.3f} | {bus_gbps(n, c):.2f} | "
                     f"{bus_gbps(n, t):.2f} | {c / t:.2f} | {cm / tm:.2f} | "
                     f"{c / k:.2f}, {cm / km:.2f} |")
    lines += [
        "",
        "The tpu column includes everything a caller waits for: the device-to-host copy into a "
        "pooled host block, the fingerprint exchange that checks the call across ranks (one "
        "small Gloo allgather, overlapping the copy), Gloo's all_reduce on the block, and the "
        "result becoming the tensor's device buffer (on the CPU plugin the block itself becomes "
        "the buffer: no copy back).",
        END,
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_section(args.out, BEGIN, END, text)
    return text


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
