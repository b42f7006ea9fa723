"""Cost of the device-side index checks (csrc/runtime/index_checks.c) on the tiny-GPT training
step: the same steps with TORCH_PJRT_CHECK_BOUNDS=1 (the default) and =0 (XLA's clamping), in
Strict and defer_and_fuse modes. The setting is read once per process, so each measurement is
its own process; the two settings alternate (A B A B ...) so that machine noise hits both.

    .venv/bin/python benchmarks/bench_index_checks.py [--rounds 4] [--steps 30]
        [--out docs/performance.md]

Reports per setting and mode the median over rounds of each process's median step time, and
the ratio checks-on / checks-off. The tiny GPT's step checks its embedding (index_select) and
its cross-entropy targets (nll_loss) forward.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from markdown_section import write_section  # noqa: E402

BEGIN = "<!-- bench_index_checks: begin -->"
END = "<!-- bench_index_checks: end -->"

CHILD = r"""
import json, statistics, sys, time
import torch
from torch_pjrt import _models
steps, warmup, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
data = _models.CharDataset(_models.zen_corpus(), block=32)
g = torch.Generator().manual_seed(0)
batches = [data.batch(8, g) for _ in range(steps + warmup)]
model = _models.init_weights(_models.TinyGPT(data.vocab), seed=0).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
torch.tpu.set_eager_mode(mode)
times, losses = [], []
for i, (x, y) in enumerate(batches):
    t0 = time.perf_counter_ns()
    x, y = x.to("tpu"), y.to("tpu")
    opt.zero_grad()
    loss = model(x, y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
    if i >= warmup:
        times.append(time.perf_counter_ns() - t0)
print(json.dumps({"ms": statistics.median(times) / 1e6, "last_loss": losses[-1]}))
"""


def run_child(checks: str, mode: str, steps: int, warmup: int) -> dict:
    env = {**os.environ, "TORCH_PJRT_CHECK_BOUNDS": checks}
    r = subprocess.run([sys.executable, "-c", CHILD, str(steps), str(warmup), mode],
                       capture_output=True, text=True, env=env, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"child failed ({checks}, {mode}):\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out")
    a = p.parse_args(argv)
    res = {(c, m): [] for c in ("1", "0") for m in ("strict", "defer_and_fuse")}
    losses = {}
    for _ in range(a.rounds):
        for m in ("strict", "defer_and_fuse"):
            for c in ("1", "0"):
                out = run_child(c, m, a.steps, a.warmup)
                res[(c, m)].append(out["ms"])
                losses[(c, m)] = out["last_loss"]
    load = os.getloadavg()
    lines = [BEGIN, "",
             "## Cost of the device-side index checks (tiny-GPT training step)", "",
             f"Measured by `benchmarks/bench_index_checks.py --rounds {a.rounds} --steps "
             f"{a.steps}`: one process per measurement, checks on (`TORCH_PJRT_CHECK_BOUNDS=1`, "
             "the default) and off (`=0`) alternating; each cell is the median over "
             f"{a.rounds} processes of the median of {a.steps} steps after {a.warmup} warm-up "
             f"steps (forward, backward, AdamW, loss.item()). Default threads; load average at "
             f"the end {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}.", "",
             "| mode | checks on (ms) | checks off (ms) | on / off | per-process medians on | off |",
             "|---|---:|---:|---:|---|---|"]
    for m in ("strict", "defer_and_fuse"):
        on, off = statistics.median(res[("1", m)]), statistics.median(res[("0", m)])
        lines.append(f"| {m} | {on:.2f} | {off:.2f} | {on / off:.3f} | "
                     f"{', '.join(f'{v:.2f}' for v in res[('1', m)])} | "
                     f"{', '.join(f'{v:.2f}' for v in res[('0', m)])} |")
    same = all(losses[("1", m)] == losses[("0", m)] for m in ("strict", "defer_and_fuse"))
    lines += ["", f"Last losses equal with and without checks: {same}.", "", END, ""]
    text = "\n".join(lines)
    print(text)
    if a.out:
        write_section(a.out, BEGIN, END, text)
    return text


if __name__ == "__main__":
    main()
