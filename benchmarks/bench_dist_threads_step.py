"""The tiny-GPT training step (batch 8 per rank, block 32, AdamW) with DDP and with FSDP2 on 2
rank threads (``run_threads``, each rank on its own CPU-plugin device), over the native
transport and over the Gloo-staged one, with and without overlap of collectives and compute
(DDP: one bucket reduced after the backward vs small buckets reduced during it; FSDP2: its
defaults vs explicit all_gather prefetching): median step time of the ranks' slowest, 20 steps after
5 warm-up steps, and the collectives' share. Each (wrapper, transport) runs in a fresh process
(the transport is chosen when groups are made), in alternating order.

Usage: TORCH_PJRT_CPU_DEVICE_COUNT=2 python benchmarks/bench_dist_threads_step.py [--rounds N]
Prints a markdown table. On a 2-core machine the two ranks share the cores with each other (and,
staged, with Gloo's threads): the figures compare transports, not scaling.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

STEPS, WARMUP, BATCH, BLOCK = 20, 5, 8, 32
# ddp: one bucket, all_reduced after the backward; ddp_buckets: small buckets all_reduced during
# it (overlap); fsdp2: FSDP2's defaults; fsdp2_prefetch: explicit all_gather prefetching
WRAPPERS = ("ddp", "ddp_buckets", "fsdp2", "fsdp2_prefetch")


def child(wrapper: str) -> None:
    import time

    import torch

    from torch_pjrt import _models
    from torch_pjrt.distributed import run_threads, transport

    def rank_fn(rank):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.nn.parallel import DistributedDataParallel as DDP

        data = _models.CharDataset(_models.zen_corpus(), block=BLOCK)
        g = torch.Generator().manual_seed(rank)
        batches = [data.batch(BATCH, g) for _ in range(STEPS + WARMUP)]
        model = _models.init_weights(_models.TinyGPT(data.vocab, layers=2), seed=0).to("tpu")
        if wrapper == "ddp":
            model = DDP(model)  # the default 25 MB bucket holds every gradient: one all_reduce
        elif wrapper == "ddp_buckets":
            # ~8 buckets of 50 KB: each all_reduce is issued during the backward, as soon as its
            # gradients are ready, overlapping the rest of the backward where the device can
            model = DDP(model, bucket_cap_mb=0.05)
        else:
            mesh = init_device_mesh("tpu", (2,))
            for block in model.blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
            if wrapper == "fsdp2_prefetch":
                # explicit prefetching: each block's all_gather is issued one block ahead, in
                # the forward and in the backward
                blocks = list(model.blocks)
                for i, block in enumerate(blocks):
                    if i + 1 < len(blocks):
                        block.set_modules_to_forward_prefetch([blocks[i + 1]])
                    if i > 0:
                        block.set_modules_to_backward_prefetch([blocks[i - 1]])
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        times = []
        for i, (x, y) in enumerate(batches):
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = model(x.to("tpu"), y.to("tpu"))
            loss.backward()
            opt.step()
            loss.item()
            if i >= WARMUP:
                times.append(time.perf_counter() - t0)
        return transport(), times

    results = run_threads(rank_fn, 2)
    kinds = {k for k, _ in results}
    slowest = [max(ts) for ts in zip(*(t for _, t in results))]
    print("RESULT", wrapper, ",".join(sorted(kinds)), statistics.median(slowest))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    env0 = {**os.environ, "TORCH_PJRT_CPU_DEVICE_COUNT": "2"}
    env0.pop("LOCAL_RANK", None)
    res: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for wrapper in WRAPPERS:
            for tr in ("native", "staged"):
                env = {**env0, "TORCH_PJRT_DIST_TRANSPORT": tr}
                out = subprocess.run([sys.executable, __file__, "--child", wrapper], env=env,
                                     capture_output=True, text=True, check=True).stdout
                line = next(l for l in out.splitlines() if l.startswith("RESULT"))
                _, w, kind, med = line.split()
                assert kind == tr, (kind, tr)
                res.setdefault((wrapper, tr), []).append(float(med))
    print("| wrapper | native step (ms) | staged step (ms) | staged / native |")
    print("|---|---|---|---|")
    for wrapper in WRAPPERS:
        n = statistics.median(res[(wrapper, "native")]) * 1e3
        s = statistics.median(res[(wrapper, "staged")]) * 1e3
        print(f"| {wrapper} | {n:.2f} | {s:.2f} | {s / n:.2f}x |")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        main()
