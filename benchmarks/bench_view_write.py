"""Indexed writes into a view vs the same write on the base tensor (issue: writes through views
must cost the written slice, not the storage).

A KV-cache-shaped float32 tensor kv[blocks, 16, 8, 2*64] (K and V halves in the last dim);
`kc = kv.chunk(2, dim=3)[0]` is a non-contiguous view of half of it. Timed: `kc[blk, :, off] =
val` with `blk`, `off` two-element index tensors on tpu, then one element read back (`.item()`,
so the write has run), against `kv[blk, :, off] = val2` on the base (the same number of index
tensors, a value twice as wide). Also the same block write as index_copy_ (two blocks along
dim 0) and scatter_ (one block's elements along dim 0), into the view and into the base. Median
of N repetitions per op and storage size, Strict mode.

    .venv/bin/python benchmarks/bench_view_write.py [--sizes-mb 16 64 256] [--reps 100]
        [--out docs/performance.md]

The view and base repetitions alternate, so that other load on the machine falls on both.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from markdown_section import write_section  # noqa: E402

BEGIN = "<!-- bench_view_write: begin -->"
END = "<!-- bench_view_write: end -->"


def _time_pair(fa, fb, reps: int) -> tuple[float, float]:
    """Medians (ms) of fa and fb, their repetitions interleaved: other processes on the machine
    then load both alike, and the ratio compares like with like."""
    for _ in range(2):  # compile / warm
        fa()
        fb()
    ta, tb = [], []
    for _ in range(reps):
        for fn, ts in ((fa, ta), (fb, tb)):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return statistics.median(ta) * 1e3, statistics.median(tb) * 1e3


def run(size_mb: int, reps: int) -> list[dict]:
    heads, d = 8, 64
    blocks = size_mb * (1 << 20) // (16 * heads * 2 * d * 4)
    kv = torch.zeros(blocks, 16, heads, 2 * d, device="tpu")
    kc = kv.chunk(2, dim=3)[0]
    blk = torch.tensor([3, blocks - 2], device="tpu")
    off = torch.tensor([7, 2], device="tpu")
    val = torch.randn(2, 16, d, device="tpu")
    val2 = torch.randn(2, 16, 2 * d, device="tpu")
    src = torch.randn(2, 16, heads, d, device="tpu")
    src2 = torch.randn(2, 16, heads, 2 * d, device="tpu")
    sidx = torch.full((1, 16, heads, d), blocks - 2, device="tpu")
    sidx2 = torch.full((1, 16, heads, 2 * d), blocks - 2, device="tpu")

    def row(op, view_write, base_write):
        def synced(write):
            def fn():
                write()
                kv[0, 0, 0, 0].item()
            return fn
        view, base = _time_pair(synced(view_write), synced(base_write), reps)
        return {"op": op, "MB": size_mb, "view": view, "base": base}

    def put_view():
        kc[blk, :, off] = val

    def put_base():
        kv[blk, :, off] = val2

    rows = [row("x[blk, :, off] = v", put_view, put_base)]
    # the result is right (spot check against a CPU replay of the last write)
    assert torch.equal(kv[blk.cpu()[0], :, off.cpu()[0]].cpu(), val2[0].cpu())
    rows.append(row("index_copy_(0, blk, src)", lambda: kc.index_copy_(0, blk, src),
                    lambda: kv.index_copy_(0, blk, src2)))
    rows.append(row("scatter_(0, idx, src)", lambda: kc.scatter_(0, sidx, src[:1]),
                    lambda: kv.scatter_(0, sidx2, src2[:1])))
    assert torch.equal(kv[blocks - 2].cpu(), src2[0].cpu())
    del kv, kc
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = [r for s in a.sizes_mb for r in run(s, a.reps)]
    load = os.getloadavg()
    lines = [BEGIN, "", "## Indexed writes into a view (KV-cache block write)", "",
             f"Measured by `benchmarks/bench_view_write.py` (torch {torch.__version__}, PJRT "
             f"`{torch.tpu.get_device_properties(0).platform}`, torch.get_num_threads() = "
             f"{torch.get_num_threads()}, load average at the end {load[0]:.1f}/{load[1]:.1f}/"
             f"{load[2]:.1f}). `kc = kv.chunk(2, dim=3)[0]; kc[blk, :, off] = val` (2 blocks) vs "
             f"`kv[blk, :, off] = val2` on the base; the same two blocks written by `index_copy_` along "
             f"dim 0, and one block by `scatter_` along dim 0, into `kc` vs into `kv`. Each write "
             f"is followed by a one-element `.item()`; median of {a.reps}, the view and base writes "
             f"interleaved, Strict mode.", "",
             "| write | storage | into the view (ms) | into the base (ms) | view / base |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['op']}` | {r['MB']} MB | {r['view']:.3f} | {r['base']:.3f} | "
                     f"{r['view'] / r['base']:.2f} |")
    lines += ["", END, ""]
    text = "\n".join(lines)
    print(text)
    if a.out:
        write_section(a.out, BEGIN, END, text)


if __name__ == "__main__":
    main()
