"""A compiled tensor-parallel training step on 2 rank threads (``run_threads``, each rank on its
own CPU-plugin device) with the graphs' functional collectives fused into the graphs' programs
(one SPMD program per graph over both devices, the native transport's default), materialized
(``TORCH_PJRT_FUSE_COLLECTIVES=0``: each collective its own program between the graph's fused
pieces, which then run through the recorder), and over the Gloo-staged transport.

The model: `LAYERS` blocks of Linear(D, 4D) -> GELU -> Linear(4D, D), each block's first Linear
column-wise and its second row-wise parallel (one all_reduce per block in the forward and one in
the backward), the whole model under ``torch.compile(backend="tpu")``; the step: forward, MSE
loss, backward, SGD, ``loss.item()``. Per configuration, a fresh process (the switches are read
once), in alternating order over the rounds: median step time of the ranks' slowest over
`STEPS` steps after `WARMUP`, and per rank and step the programs executed and the compiled
graphs run as one program (``torch.tpu.metrics()``: executions, graph_runs).

Usage: python benchmarks/bench_spmd_graphs.py [--rounds N] [--out docs/distributed.md]
On a 2-core machine both ranks (and, staged, Gloo's threads) share the cores: the figures
compare the ways of running the same step, not scaling.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

STEPS, WARMUP, BATCH, D, LAYERS = 20, 5, 64, 256, 4
CONFIGS = {  # name: (transport, environment)
    "fused": ("native", {}),
    "materialized": ("native", {"TORCH_PJRT_FUSE_COLLECTIVES": "0"}),
    "staged": ("staged", {}),
}
BEGIN, END = "<!-- bench_spmd_graphs: begin -->", "<!-- bench_spmd_graphs: end -->"


def child() -> None:
    import time

    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    from torch_pjrt.distributed import run_threads, transport

    def rank_fn(rank):
        torch.manual_seed(0)
        mesh = init_device_mesh("tpu", (2,))
        model = torch.nn.Sequential(*[
            torch.nn.Sequential(torch.nn.Linear(D, 4 * D), torch.nn.GELU(),
                                torch.nn.Linear(4 * D, D)) for _ in range(LAYERS)]).to("tpu")
        plan = {}
        for i in range(LAYERS):
            plan[f"{i}.0"] = ColwiseParallel()
            plan[f"{i}.2"] = RowwiseParallel()
        parallelize_module(model, mesh, plan)
        step_model = torch.compile(model, backend="tpu")
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(BATCH, D, generator=g).to("tpu")
        y = torch.randn(BATCH, D, generator=g).to("tpu")
        times = []
        for i in range(STEPS + WARMUP):
            if i == WARMUP:
                torch.distributed.barrier()  # both ranks' windows hold the same steps
                before = torch.tpu.metrics()
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(step_model(x), y)
            loss.backward()
            opt.step()
            loss.item()
            if i >= WARMUP:
                times.append(time.perf_counter() - t0)
        torch.distributed.barrier()
        after = torch.tpu.metrics()
        # process-wide counters: both ranks' steps
        per = {k: (after[k] - before[k]) / (2 * STEPS) for k in ("executions", "graph_runs")}
        return transport(), times, per

    results = run_threads(rank_fn, 2)
    kinds = {k for k, _, _ in results}
    slowest = [max(ts) for ts in zip(*(t for _, t, _ in results))]
    per = results[0][2]
    print("RESULT", ",".join(sorted(kinds)), statistics.median(slowest), per["executions"],
          per["graph_runs"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="markdown file whose section this benchmark rewrites")
    args = ap.parse_args()
    env0 = {**os.environ, "TORCH_PJRT_CPU_DEVICE_COUNT": "2"}
    for k in ("LOCAL_RANK", "TORCH_PJRT_FUSE_COLLECTIVES", "TORCH_PJRT_DIST_TRANSPORT"):
        env0.pop(k, None)
    res: dict[str, list[tuple[float, float, float]]] = {}
    for _ in range(args.rounds):
        for name, (tr, extra) in CONFIGS.items():
            env = {**env0, "TORCH_PJRT_DIST_TRANSPORT": tr, **extra}
            out = subprocess.run([sys.executable, __file__, "--child"], env=env,
                                 capture_output=True, text=True, check=True).stdout
            line = next(l for l in out.splitlines() if l.startswith("RESULT"))
            _, kind, med, execs, runs = line.split()
            assert kind == tr, (kind, tr)
            res.setdefault(name, []).append((float(med), float(execs), float(runs)))
    fused = statistics.median(r[0] for r in res["fused"])
    lines = [BEGIN, "## Compiled tensor parallelism: collectives inside the graphs' programs", "",
             f"Measured by `python benchmarks/bench_spmd_graphs.py --rounds {args.rounds}` "
             f"({os.cpu_count()} cores, load average at the end "
             f"{', '.join(f'{v:.1f}' for v in os.getloadavg())}): {LAYERS} tensor-parallel MLP "
             f"blocks (d {D}, hidden {4 * D}, batch {BATCH}) on 2 rank threads, the model under "
             f"`torch.compile(backend=\"tpu\")`, forward + MSE + backward + SGD + `loss.item()`; "
             f"median of the ranks' slowest step over {STEPS} steps after {WARMUP}, median over "
             f"the rounds, each configuration in a fresh process. *Programs*: program executions "
             f"per rank and step; *graph runs*: compiled graphs run as one captured program.", "",
             "| collectives | transport | step (ms) | vs fused | programs per rank-step | "
             "graph runs per rank-step |", "|---|---|---:|---:|---:|---:|"]
    for name, (tr, _) in CONFIGS.items():
        med = statistics.median(r[0] for r in res[name])
        execs = statistics.median(r[1] for r in res[name])
        runs = statistics.median(r[2] for r in res[name])
        lines.append(f"| {name} | {tr} | {med * 1e3:.2f} | {med / fused:.2f}x | {execs:.1f} | "
                     f"{runs:.1f} |")
    lines.append(END)
    section = "\n".join(lines) + "\n"
    print(section)
    if args.out:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from markdown_section import write_section

        write_section(args.out, BEGIN, END, section)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child()
    else:
        main()
