"""DDP training throughput on tpu over tpu_dist: the tiny GPT (batch 8 per rank, block 32,
AdamW) on 1 rank and on 2 ranks (each rank its own device, TORCH_PJRT_CPU_DEVICE_COUNT=2), in
tokens per second over all ranks; median step time of 20 steps after 5 warm-up steps. One
process per rank, started here (env:// rendezvous on localhost).

Usage: python benchmarks/bench_ddp.py [--out docs/distributed.md]
Prints a markdown section; with --out, replaces that section of the file (or appends it).
On this 2-core VM two ranks share the cores with each other and with Gloo's threads, so the
2-rank figure measures overhead more than scaling.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

from markdown_section import write_section  # benchmarks/ is the script's directory

BEGIN, END = "<!-- bench_ddp: begin -->", "<!-- bench_ddp: end -->"
STEPS, WARMUP, BATCH, BLOCK = 20, 5, 8, 32


def rank_main() -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from torch_pjrt import _models

    dist.init_process_group("tpu_dist")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("tpu", rank % torch.tpu.device_count())
    torch.tpu.set_device(device)
    data = _models.CharDataset(_models.zen_corpus(), block=BLOCK)
    g = torch.Generator().manual_seed(rank)
    batches = [data.batch(BATCH, g) for _ in range(STEPS + WARMUP)]
    model = _models.init_weights(_models.TinyGPT(data.vocab, layers=2), seed=0).to(device)
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-3)
    times = []
    for i, (x, y) in enumerate(batches):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = ddp(x.to(device), y.to(device))
        loss.backward()
        opt.step()
        loss.item()
        if i >= WARMUP:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    if rank == 0:
        print("RESULT", med, world * BATCH * BLOCK / med, torch.tpu.metrics()["cpu_fallbacks"])
    dist.destroy_process_group()


def run(world: int) -> tuple[float, float, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "TORCH_PJRT_CPU_DEVICE_COUNT": str(world)}
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=600) for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("a rank failed:\n" + "\n".join(o[1][-2000:] for o in outs))
    line = [ln for ln in outs[0][0].splitlines() if ln.startswith("RESULT")][0].split()
    return float(line[1]), float(line[2]), int(line[3])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out")
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank:
        rank_main()
        return
    rows = {world: run(world) for world in (1, 2)}
    load = os.getloadavg()
    lines = [BEGIN, "## Benchmark: DDP tiny-GPT training throughput, 1 vs 2 ranks", "",
             f"Measured by `python benchmarks/bench_ddp.py` ({os.cpu_count()} cores, load average "
             f"at the end {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}). Tiny GPT, 2 layers, batch "
             f"{BATCH} x {BLOCK} tokens per rank, AdamW, Strict mode; one process per rank, each "
             f"on its own device; median step of {STEPS} after {WARMUP} warm-up steps.", "",
             "| ranks | step (ms) | tokens/s (all ranks) | vs 1 rank | CPU fallbacks |",
             "|---:|---:|---:|---:|---:|"]
    base = rows[1][1]
    for world, (step, tps, fb) in rows.items():
        lines.append(f"| {world} | {step * 1e3:.2f} | {tps:.0f} | {tps / base:.2f}x | {fb} |")
    lines += ["", END, ""]
    report = "\n".join(lines)
    print(report)
    if args.out:
        write_section(args.out, BEGIN, END, report)


if __name__ == "__main__":
    main()
