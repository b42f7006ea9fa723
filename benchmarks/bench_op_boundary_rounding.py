"""Cost of rounding half-precision results at every op boundary inside fused programs (F27,
docs/reliability.md): torch_pjrt compiles with xla_allow_excess_precision=false unless XLA_FLAGS
names the flag. This runs the same bfloat16 workloads in two fresh processes, one with the
default and one with XLA_FLAGS=--xla_allow_excess_precision=true (XLA's own default), each
with its own empty program cache, and prints medians and their ratio:

- the tiny-GPT forward+backward step of a bfloat16 model, DeferAndFuse and torch.compile;
- a chain of 64 bfloat16 elementwise ops on 256x256 tensors (the case where rounding adds the
  most converts per op), DeferAndFuse and torch.compile.

Usage: python benchmarks/bench_op_boundary_rounding.py [--reps N]
Threads: PyTorch's defaults; nothing else should run (the child prints torch.get_num_threads()).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

CHILD = textwrap.dedent("""
    import json, statistics, sys, time, torch, torch_pjrt
    from torch_pjrt import _models
    reps = int(sys.argv[1])
    torch.manual_seed(0)
    res = {"threads": torch.get_num_threads()}

    def timed(fn, warm=3):
        for _ in range(warm):
            fn()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    model = _models.TinyGPT(vocab=64, block=32, d=128, heads=4, layers=2).to(torch.bfloat16).to("tpu")
    x = torch.randint(0, 64, (8, 32)).to("tpu"); y = torch.randint(0, 64, (8, 32)).to("tpu")

    def step(m):
        def run():
            loss = m(x, y); loss.backward(); loss.item()
        return run
    with torch_pjrt.modes.eager_mode("defer_and_fuse"):
        res["gpt_defer_ms"] = 1e3 * timed(step(model))
    cm = torch.compile(model, backend="tpu")
    res["gpt_compile_ms"] = 1e3 * timed(step(cm))

    a = torch.randn(256, 256, dtype=torch.bfloat16).to("tpu")
    def chain(t):
        for _ in range(16):
            t = torch.sin(t * 1.5 + 0.25).exp2() * 0.5
        return t
    with torch_pjrt.modes.eager_mode("defer_and_fuse"):
        res["chain_defer_ms"] = 1e3 * timed(lambda: chain(a).cpu())
    cc = torch.compile(chain, backend="tpu")
    res["chain_compile_ms"] = 1e3 * timed(lambda: cc(a).cpu())
    print("RESULT" + json.dumps(res))
""")


def run(flags: str, reps: int) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCH_PJRT_CACHE_DIR": cache}
        env.pop("XLA_FLAGS", None)
        if flags:
            env["XLA_FLAGS"] = flags
        r = subprocess.run([sys.executable, "-c", CHILD, str(reps)], env=env, capture_output=True,
                           text=True, timeout=1200)
        if r.returncode:
            sys.exit(f"child failed:\n{r.stderr[-3000:]}")
        line = next(l for l in r.stdout.splitlines() if l.startswith("RESULT"))
        return json.loads(line[len("RESULT"):])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args()
    rounded = run("", args.reps)
    excess = run("--xla_allow_excess_precision=true", args.reps)
    print(f"threads: {rounded['threads']}; medians of {args.reps} runs after 3 warm-up runs\n")
    print("| workload (bfloat16) | rounded (default) ms | excess precision ms | ratio |")
    print("|---|---|---|---|")
    for k in ("gpt_defer_ms", "gpt_compile_ms", "chain_defer_ms", "chain_compile_ms"):
        print(f"| {k[:-3]} | {rounded[k]:.3f} | {excess[k]:.3f} | {rounded[k] / excess[k]:.2f} |")


if __name__ == "__main__":
    main()
