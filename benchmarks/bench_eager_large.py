"""Eager ops on large tensors, the ones a training step spends its time in outside matmuls:
fused AdamW and SGD steps, gradient norms, fresh zero tensors and MoE's grouped GEMM, on tpu
(Strict) against CPU eager in the same process.

Each row: median of --reps calls after warm-up, each call synchronized (tpu: the device
queue drained; CPU ops are synchronous), and the minor page faults per call of this process
(a fault per fresh 4 KiB page: a program that writes its results to new buffers instead of
the donated ones pays them on every call). Shapes are those of torchtitan's qwen3 MoE debug
model under FSDP2 + EP2 (expert weights 16 x 768 x 256 per rank, 32 local experts, about 4096
routed rows per rank).

    .venv/bin/python benchmarks/bench_eager_large.py [--reps 10] [--out docs/performance.md]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

import torch

BEGIN, END = "<!-- bench_eager_large: begin -->", "<!-- bench_eager_large: end -->"


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _measure(fn, sync, reps: int) -> tuple[float, float]:
    """(median ms, page faults per call)."""
    for _ in range(3):
        fn()
    sync()
    times, f0 = [], _faults()
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), (_faults() - f0) / reps


def _cases(dev: str):
    """(name, fn) pairs; every tensor is made here, on `dev`, from the same seed."""
    g = torch.Generator().manual_seed(0)

    def rand(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype).to(dev)

    def adamw(n):
        ps = [rand(16, 768, 256) for _ in range(n)]
        gs = [rand(16, 768, 256) for _ in range(n)]
        m1, m2 = [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps]
        steps = [torch.tensor(1.0, device=dev) for _ in ps]
        return lambda: torch._fused_adamw_(ps, gs, m1, m2, [], steps, lr=1e-3, beta1=0.9,
                                           beta2=0.95, weight_decay=0.1, eps=1e-8,
                                           amsgrad=False, maximize=False)

    def sgd(n):
        ps = [rand(16, 768, 256) for _ in range(n)]
        gs = [rand(16, 768, 256) for _ in range(n)]
        bufs = [torch.zeros_like(p) for p in ps]
        return lambda: torch._fused_sgd_(ps, gs, bufs, weight_decay=0.01, momentum=0.9, lr=0.1,
                                         dampening=0.0, nesterov=False, maximize=False,
                                         is_first_step=False)

    norms = [rand(16, 768, 256) for _ in range(8)]
    big = rand(16, 768, 256)
    experts, rows = 32, 4096
    sizes = torch.distributions.Multinomial(rows, torch.ones(experts)).sample().long()
    offs = torch.cumsum(sizes, 0).to(torch.int32).to(dev)
    a = rand(rows, 256, dtype=torch.bfloat16).requires_grad_()
    w = (rand(experts, 256, 768, dtype=torch.bfloat16) * 0.05).requires_grad_()
    gout = rand(rows, 768, dtype=torch.bfloat16)

    def grouped_mm():
        torch._grouped_mm(a, w, offs=offs).backward(gout)

    return [
        ("_fused_adamw_, 4 x 3.1M", adamw(4)),
        ("_fused_adamw_, 24 x 3.1M", adamw(24)),
        ("_fused_sgd_ (momentum), 4 x 3.1M", sgd(4)),
        ("linalg.vector_norm (2), 3.1M", lambda: torch.linalg.vector_norm(big)),
        ("_foreach_norm, 8 x 3.1M", lambda: torch._foreach_norm(norms)),
        ("torch.zeros, 50 MB", lambda: torch.zeros(64, 256, 768, device=dev)),
        ("_grouped_mm fwd+bwd, bf16, 32 experts, 4096 rows", grouped_mm),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", help="docs file to write the section into")
    args = ap.parse_args(argv)
    import torch_pjrt  # noqa: F401

    torch.manual_seed(0)
    rows = []
    cpu = {n: _measure(f, lambda: None, args.reps) for n, f in _cases("cpu")}
    tpu = {n: _measure(f, torch.tpu.synchronize, args.reps) for n, f in _cases("tpu")}
    for name in cpu:
        (c_ms, c_pf), (t_ms, t_pf) = cpu[name], tpu[name]
        rows.append(f"| {name} | {c_ms:.2f} | {t_ms:.2f} | {t_ms / c_ms:.2f}x | {c_pf:.0f} | "
                    f"{t_pf:.0f} |")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    section = "\n".join([
        BEGIN,
        "## Eager ops on large tensors",
        "",
        f"Measured by `python benchmarks/bench_eager_large.py` (torch {torch.__version__}, "
        f"torch.get_num_threads() = {torch.get_num_threads()}, {os.cpu_count()} cores, load "
        f"average at the end {load}). Median of {args.reps} synchronized calls after warm-up; "
        "page faults: minor faults of the process per call. tpu is Strict mode.",
        "",
        "| op | CPU eager (ms) | tpu (ms) | tpu / CPU | CPU faults/call | tpu faults/call |",
        "|---|---:|---:|---:|---:|---:|",
        *rows,
        END,
        "",
    ])
    print(section)
    if args.out:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from markdown_section import write_section

        write_section(args.out, BEGIN, END, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
