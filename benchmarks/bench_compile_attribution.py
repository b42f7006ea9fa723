"""Where the compiled tiny-GPT training step spends its time (torch.tpu.step_profile()): the
step's wall time against Inductor's on the CPU and against the device time of its programs, and
the host time in this backend, in Dynamo's and AOTAutograd's wrappers and elsewhere.

Usage: python benchmarks/bench_compile_attribution.py [--layers 2 4 6 12] [--steps 30] [--out FILE]
Prints a markdown section; with --out, replaces that section of the file (or appends it).
One process per layer count (fresh Dynamo state, same thread count: PyTorch's default unless
--threads). Per layer count: `--steps` timed steps without the profile (the wall-time median), then
the same number under the profile (its attribution; the profiler's own ranges add host time
there, so its wall column is not the figure to compare).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

BEGIN, END = "<!-- bench_compile_attribution: begin -->", "<!-- bench_compile_attribution: end -->"


def one(layers: int, steps: int, warmup: int, kind: str = "tpu") -> dict:
    """kind "tpu": the step compiled by this backend, timed, then profiled; "tpugraph": the eager
    step recorded as one program (torch.tpu.TPUGraph) and replayed, timed, then profiled;
    "inductor": the same step on the CPU compiled by Inductor, timed only."""
    import torch

    import torch_pjrt  # noqa: F401
    from torch_pjrt import _models

    device = "cpu" if kind == "inductor" else "tpu"
    data = _models.CharDataset(_models.zen_corpus(), block=32)
    g = torch.Generator().manual_seed(0)
    batches = [data.batch(8, g) for _ in range(warmup + 2 * steps)]
    model = _models.init_weights(_models.TinyGPT(data.vocab, layers=layers), seed=0).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, capturable=device == "tpu")

    def step(x, y):
        opt.zero_grad(set_to_none=kind != "tpugraph")
        loss = model(x, y)
        loss.backward()
        opt.step()
        return loss

    if kind == "tpugraph":  # the eager step recorded whole (torch.tpu.TPUGraph), replayed
        static = [t.to(device) for t in batches[0]]
        for _ in range(warmup):
            step(*static)
        graph = torch.tpu.TPUGraph()
        with torch.tpu.graph(graph):
            static_loss = step(*static)

        def run(x, y):
            static[0].copy_(x)
            static[1].copy_(y)
            graph.replay()
            return static_loss.item()
    else:
        step = torch.compile(step, backend="tpu" if kind == "tpu" else "inductor")

        def run(x, y):
            return step(x.to(device), y.to(device)).item()

    it = iter(batches)
    for _ in range(warmup):
        run(*next(it))
    walls = []
    for _ in range(steps):
        x, y = next(it)
        t0 = time.perf_counter_ns()
        run(x, y)
        walls.append((time.perf_counter_ns() - t0) / 1e6)
    if kind == "inductor":
        return {"layers": layers, "threads": torch.get_num_threads(),
                "wall_ms": statistics.median(walls)}
    with torch.tpu.step_profile() as prof:
        for _ in range(steps):
            x, y = next(it)
            with prof.step():
                run(x, y)
    s = prof.summary()
    from importlib import metadata

    try:
        plugin = "lammps-jax-pjrt-cpu " + metadata.version("lammps-jax-pjrt-cpu")
    except metadata.PackageNotFoundError:
        plugin = torch.tpu.diagnostics().get("plugin_path", "?")
    return {"layers": layers, "threads": torch.get_num_threads(), "wall_ms": statistics.median(walls),
            "torch": torch.__version__, "device": torch.tpu.get_device_name(),
            "plugin": plugin, "pjrt_api": torch.tpu.diagnostics().get("api_version"), **s}


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, nargs="*", default=[2, 4, 6, 12])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads in each child")
    p.add_argument("--out")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--kind", default="tpu", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        print(json.dumps(one(args.child, args.steps, args.warmup, args.kind)))
        return ""

    def child(layers, kind):
        out = subprocess.run([sys.executable, __file__, "--child", str(layers), "--kind", kind,
                              "--steps", str(args.steps), "--warmup", str(args.warmup),
                              "--threads", str(args.threads)],
                             check=True, capture_output=True, text=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    def jax_child(layers):
        """The same step in plain JAX (bench_jax_step.py), or None where JAX is missing."""
        out = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(
            __file__)), "bench_jax_step.py"), "--child", str(layers), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--threads", str(args.threads)],
            capture_output=True, text=True)
        return json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None

    results = []
    for layers in args.layers:  # Inductor's, JAX's, the TPUGraph's process, then ours
        inductor = child(layers, "inductor")
        jax = jax_child(layers)
        graphed = child(layers, "tpugraph")
        results.append({**child(layers, "tpu"), "inductor_ms": inductor["wall_ms"],
                        "jax": jax, "graph": graphed})
    load = os.getloadavg()
    r0 = results[0]
    lines = [
        BEGIN,
        "## Where the compiled training step's time goes",
        "",
        f"Measured by `benchmarks/bench_compile_attribution.py` (torch {r0['torch']}, PJRT "
        f"`{r0['device']}` from {r0['plugin']} (PJRT C API {r0['pjrt_api']}), "
        + (f"JAX {next(r['jax'] for r in results if r['jax'])['jax']} with its own jaxlib XLA, "
           if any(r["jax"] for r in results) else "")
        + f"{os.cpu_count()} cores, torch.get_num_threads() = {r0['threads']}, "
        f"load average at the end {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}). The tiny-GPT step "
        "of bench_compile (batch copy, zero_grad, forward, backward, AdamW, `loss.item()`), the "
        "whole step function under `torch.compile(backend=\"tpu\")`, one fresh process per layer "
        f"count. *step*: median wall time of {args.steps} steps after {args.warmup} warm-up steps, "
        "no profile. The other columns are medians of the next "
        f"{args.steps} steps under `torch.tpu.step_profile()`: *device*: the device time of the "
        "step's programs (each from its issue, or the previous completion, to its completion); "
        "*backend host*: inside the graph runners; *Dynamo/AOT wrappers*: in Dynamo's guard check "
        "and compiled frames and AOTAutograd's functions, less the backend's time inside them; "
        "*other host*: the rest of the step's host time (eager ops, the autograd engine, Python); "
        "*waiting*: the final synchronize. *Inductor*: the same step on the CPU under "
        "`torch.compile(backend=\"inductor\")` (AdamW without `capturable`), in its own fresh "
        "process just before ours, timed the same way. *TPUGraph*: the same step run eagerly, "
        "recorded whole by `torch.tpu.graph` after the warm-up (forward, backward, AdamW: one "
        "program) and replayed (`copy_` of the batch into the static inputs, `replay()`, "
        "`loss.item()`), in a fresh process; its device time from the profile. *JAX jit*: the "
        "same model and AdamW in plain JAX, the whole step one `jax.jit` with donation "
        "(`benchmarks/bench_jax_step.py`: batch `device_put`, step, `float(loss)`; its own "
        "weights and batches of the same shapes), in a fresh process.",
        "",
        "| layers | step (ms) | Inductor (ms) | step / Inductor | JAX jit (ms) | step / JAX | device (ms) | step / device | backend host (ms) | Dynamo/AOT wrappers (ms) | other host (ms) | waiting (ms) | programs per step | TPUGraph step (ms) | TPUGraph / Inductor | TPUGraph device (ms) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        runs = sum(p["runs_per_step"] for p in r["programs"].values())
        jax = (f"{r['jax']['wall_ms']:.2f} | {r['wall_ms'] / r['jax']['wall_ms']:.2f}x"
               if r["jax"] else "- | -")
        lines.append(f"| {r['layers']} | {r['wall_ms']:.2f} | {r['inductor_ms']:.2f} | "
                     f"{r['wall_ms'] / r['inductor_ms']:.2f}x | {jax} | {r['device_ms']:.2f} | "
                     f"{r['wall_ms'] / r['device_ms']:.2f}x | {r['backend_host_ms']:.2f} | "
                     f"{r['wrapper_host_ms']:.2f} | {r['other_host_ms']:.2f} | "
                     f"{r['waiting_ms']:.2f} | {runs:g} | {r['graph']['wall_ms']:.2f} | "
                     f"{r['graph']['wall_ms'] / r['inductor_ms']:.2f}x | "
                     f"{r['graph']['device_ms']:.2f} |")
    lines += ["", "Device time per program (median per execution; per step):", "",
              "| layers | program | runs per step | device ms each | device ms per step |",
              "|---:|---|---:|---:|---:|"]
    for r in results:
        for lab, p in sorted(r["programs"].items(), key=lambda kv: -kv[1]["total_ms_per_step"]):
            lines.append(f"| {r['layers']} | {lab} | {p['runs_per_step']:g} | "
                         f"{p['median_ms']:.3f} | {p['total_ms_per_step']:.3f} |")
    lines += ["", END, ""]
    report = "\n".join(lines)
    print(report)
    if args.out:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from markdown_section import write_section

        write_section(args.out, BEGIN, END, report)
    return report


if __name__ == "__main__":
    main()
