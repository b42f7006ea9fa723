"""FlexAttention on tpu: block sparsity's saving, and the kernels against dense attention.

One process, each row timed in turn: median of --reps calls after warm-up, each call
synchronized (the output read back). Rows: the compiled flex_attention (plain torch.compile,
as torchtitan calls it) with a causal BlockMask, the same with a mask that keeps everything
(every block computed: the dense cost of the same kernels), scaled_dot_product_attention with
is_causal=True (this backend's fused attention), and on the CPU, PyTorch's compiled
flex_attention (Inductor's C++ template; forward only, CPU's flex has no backward) and SDPA.
*scores computed*: the fraction of the L x L scores the kernels compute for that mask.

    .venv/bin/python benchmarks/bench_flex_attention.py [--seq 2048] [--out docs/kernels.md]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

BEGIN, END = "<!-- bench_flex_attention: begin -->", "<!-- bench_flex_attention: end -->"


def causal(b, h, q, kv):
    return q >= kv


def everything(b, h, q, kv):
    return q >= 0


def _median_ms(fn, reps, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _fraction(mask_mod, n):
    from torch_pjrt import flex_attention as fx

    return fx.computed_fraction(create_block_mask(mask_mod, 1, 1, n, n, device="tpu").as_tuple(),
                                n, n)


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--out", help="replace (or append) this section in the markdown file")
    args = p.parse_args(argv)
    n, h, d = args.seq, args.heads, args.dim
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, n, d, generator=g) for _ in range(3))
    rows = []

    def tpu_rows():
        qt, kt, vt = (t.to("tpu").requires_grad_() for t in (q, k, v))
        flex = torch.compile(flex_attention)
        for name, mask_mod in (("causal BlockMask", causal), ("mask keeping every block", everything)):
            bm = create_block_mask(mask_mod, 1, h, n, n, device="tpu")
            fwd = _median_ms(lambda: flex(qt, kt, vt, block_mask=bm).sum().item(), args.reps)

            def step():
                qt.grad = kt.grad = vt.grad = None
                flex(qt, kt, vt, block_mask=bm).sum().backward()
                qt.grad.sum().item()

            both = _median_ms(step, args.reps)
            rows.append((f"tpu, compiled flex_attention, {name}", _fraction(mask_mod, n), fwd, both))
        sdpa = torch.compile(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True))
        fwd = _median_ms(lambda: sdpa(qt, kt, vt).sum().item(), args.reps)

        def sdpa_step():
            qt.grad = kt.grad = vt.grad = None
            sdpa(qt, kt, vt).sum().backward()
            qt.grad.sum().item()

        rows.append(("tpu, compiled SDPA is_causal", None, fwd, _median_ms(sdpa_step, args.reps)))

    def cpu_rows():
        bm = create_block_mask(causal, 1, h, n, n, device="cpu")
        flex = torch.compile(flex_attention)
        with torch.no_grad():
            fwd = _median_ms(lambda: flex(q, k, v, block_mask=bm).sum().item(), args.reps)
        rows.append(("CPU, compiled flex_attention (Inductor), causal BlockMask", None, fwd, None))
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        fwd = _median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().item(),
                         args.reps)

        def step():
            qg.grad = kg.grad = vg.grad = None
            F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).sum().backward()

        rows.append(("CPU, SDPA is_causal (eager)", None, fwd, _median_ms(step, args.reps)))

    tpu_rows()
    cpu_rows()
    load = os.getloadavg()
    lines = [BEGIN,
             "## FlexAttention: block sparsity and the kernels against dense attention", "",
             f"Measured by `benchmarks/bench_flex_attention.py --seq {n}` (torch {torch.__version__}, "
             f"PJRT `{torch.tpu.get_device_name()}`, torch.get_num_threads() = "
             f"{torch.get_num_threads()}, load average at the end {load[0]:.1f}/{load[1]:.1f}/"
             f"{load[2]:.1f}). Batch 1, {h} heads, sequence {n}, head dim {d}, float32; median of "
             f"{args.reps} synchronized calls after 3 warm-up calls, all rows in one process. "
             "*forward + backward*: the output's sum backpropagated, a gradient read back.", "",
             "| attention | scores computed | forward (ms) | forward + backward (ms) |",
             "|---|---:|---:|---:|"]
    for name, frac, fwd, both in rows:
        lines.append(f"| {name} | {'' if frac is None else f'{frac:.0%}'} | {fwd:.1f} | "
                     f"{'' if both is None else f'{both:.1f}'} |")
    lines.append(END)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from markdown_section import write_section

        write_section(args.out, BEGIN, END, text)
    return text


if __name__ == "__main__":
    main()
