"""Time to the first training step in a fresh process, with a cold and with a warm persistent
compile cache (measured, not asserted).

    python benchmarks/bench_cold_start.py [--out docs/performance.md]

Each run is a new Python process with TORCH_PJRT_CACHE_DIR pointing at one temporary directory:
the first run starts empty (cold), the following runs find the programs the first one stored
(warm). The child reports the time from `import torch` to the end of the first TinyGPT
training step (loss.item() returned), the part of it after `import torch` returned, and the
number of compiles it did. Both Strict and DeferAndFuse are measured (each with its own cache
directory).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

CHILD = """
    import time
    t0 = time.perf_counter()
    import json, torch
    t_import = time.perf_counter()
    from torch_pjrt._models import CharDataset, TinyGPT, init_weights, zen_corpus
    data = CharDataset(zen_corpus(), block=32)
    model = init_weights(TinyGPT(data.vocab, block=32), seed=0).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x, y = data.batch(8, torch.Generator().manual_seed(0))
    loss = model(x.to("tpu"), y.to("tpu"))
    loss.backward()
    opt.step()
    loss.item()
    t1 = time.perf_counter()
    print(json.dumps({"seconds": t1 - t0, "after_import": t1 - t_import,
                      "compiles": torch.tpu.metrics()["compiles"],
                      "disk_hits": torch.tpu.cache_stats()["disk_cache_hits"]}))
"""


def child(cache_dir, mode):
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=cache_dir, TORCH_PJRT_EAGER_MODE=mode)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD)], capture_output=True,
                       text=True, env=env, timeout=600)
    if r.returncode:
        raise RuntimeError(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="append the markdown section to this file")
    ap.add_argument("--warm-runs", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for mode in ("strict", "defer_and_fuse"):
        with tempfile.TemporaryDirectory(prefix="torch_pjrt_bench_cache_") as d:
            cold = child(d, mode)
            warm = [child(d, mode) for _ in range(args.warm_runs)]
        rows.append((mode, cold, warm))
    lines = [
        "",
        "## Time to the first TinyGPT training step in a fresh process",
        "",
        "From `import torch` to the first step's `loss.item()` (TinyGPT, batch 8, AdamW), one "
        "process per run; per mode, all runs share one fresh TORCH_PJRT_CACHE_DIR "
        "(`benchmarks/bench_cold_start.py`). `after import` excludes `import torch` itself.",
        "",
        "| mode | cache | seconds | after import (s) | compiles | disk-cache hits |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for mode, cold, warm in rows:
        wmed = statistics.median(w["seconds"] for w in warm)
        wafter = statistics.median(w["after_import"] for w in warm)
        lines += [
            f"| {mode} | cold (empty) | {cold['seconds']:.2f} | {cold['after_import']:.2f} | "
            f"{cold['compiles']} | {cold['disk_hits']} |",
            f"| {mode} | warm (median of {len(warm)}) | {wmed:.2f} | {wafter:.2f} | "
            f"{warm[0]['compiles']} | {warm[0]['disk_hits']} |",
            f"| {mode} | warm / cold | {wmed / cold['seconds']:.0%} | "
            f"{wafter / cold['after_import']:.0%} | | |",
        ]
    lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
