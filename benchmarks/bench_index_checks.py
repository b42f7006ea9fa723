"""Cost of the device-side index checks (csrc/runtime/index_checks.c) on the tiny-GPT training
step: the same steps with the checks on (the default) and off (XLA's clamping), in Strict and
defer_and_fuse modes. In one process: the setting is switched between blocks of steps
(torch_pjrt._C._set_index_checks; each setting's programs are cached under their own keys),
alternating on/off so that machine noise hits both alike.

    .venv/bin/python benchmarks/bench_index_checks.py [--blocks 10] [--block-steps 10]
        [--out docs/performance.md]

Reports per mode the median step time over all steps of each setting and the ratio on/off.
The tiny GPT's step checks its embedding (index_select) and its cross-entropy targets
(nll_loss) forward.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_eager  # noqa: E402  (the tiny-GPT setup)
from markdown_section import write_section  # noqa: E402

BEGIN = "<!-- bench_index_checks: begin -->"
END = "<!-- bench_index_checks: end -->"


def measure(mode: str, blocks: int, block_steps: int, warmup: int) -> dict:
    from torch_pjrt import _C

    model, batches, loss_fn = bench_eager._gpt_setup(torch.device("tpu"), 8)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.tpu.set_eager_mode(mode)
    times = {True: [], False: []}

    def step(i):
        x, y = batches[i % len(batches)]
        t0 = time.perf_counter_ns()
        x, y = x.to("tpu"), y.to("tpu")
        opt.zero_grad()
        loss = loss_fn(model, x, y)
        loss.backward()
        opt.step()
        loss.item()
        return time.perf_counter_ns() - t0

    try:
        for on in (True, False):  # both settings' programs compiled before timing
            _C._set_index_checks(on)
            for i in range(warmup):
                step(i)
        for b in range(2 * blocks):
            on = b % 2 == 0
            _C._set_index_checks(on)
            for i in range(block_steps):
                times[on].append(step(i))
    finally:
        _C._set_index_checks(True)
        torch.tpu.set_eager_mode("strict")
    return {on: statistics.median(v) / 1e6 for on, v in times.items()}


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=10, help="blocks per setting")
    p.add_argument("--block-steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out")
    a = p.parse_args(argv)
    res = {m: measure(m, a.blocks, a.block_steps, a.warmup) for m in ("strict", "defer_and_fuse")}
    load = os.getloadavg()
    n = a.blocks * a.block_steps
    lines = [BEGIN, "",
             "## Cost of the device-side index checks (tiny-GPT training step)", "",
             f"Measured by `benchmarks/bench_index_checks.py --blocks {a.blocks} --block-steps "
             f"{a.block_steps}` in one process: {a.blocks} blocks of {a.block_steps} steps per "
             "setting, checks on and off alternating block by block, after warm-up steps in "
             f"both; median of {n} steps per cell (forward, backward, AdamW, batch copy, "
             f"loss.item()). torch {torch.__version__}, default threads, load average at the "
             f"end {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}.", "",
             "| mode | checks on (ms) | checks off (ms) | on / off |",
             "|---|---:|---:|---:|"]
    for m, r in res.items():
        lines.append(f"| {m} | {r[True]:.2f} | {r[False]:.2f} | {r[True] / r[False]:.3f} |")
    lines += ["", END, ""]
    text = "\n".join(lines)
    print(text)
    if a.out:
        write_section(a.out, BEGIN, END, text)
    return text


if __name__ == "__main__":
    main()
