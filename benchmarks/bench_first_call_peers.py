"""First calls at new shapes, side by side with the peers that compile through XLA too: what a
call at a shape never seen before costs on torch_pjrt (Strict, cold compile cache), PyTorch/XLA
2.9 (PJRT_DEVICE=CPU, lazy tensors synchronized after each call), and JAX (`jax.jit`, the
project's jaxlib), against CPU eager. Issue 34 item 3: it is the floor under the cold time of
PyTorch's own tests, which call each op at many shapes (test_torch.py's index tests change the
index count in every case).

Usage: python3 benchmarks/bench_first_call_peers.py [--shapes 12] [--out docs/performance.md]
                                                     [--venv /work/venv-torch-xla]

Each side runs in a fresh process of its own. For every op, `--shapes` shapes never seen
before in that process are called once each, synchronized (the result read back to the host),
and timed; then the last shape again (a cache hit). The ops, on float32:

- `add+mul`: (x + 1) * x at 1,001.. elements (torch_pjrt runs its size-bucket program here);
- `softmax`: over the last dim of (4, 250 + i);
- `index_add_`: a (6, 5) tensor, dim 0, an index of 1 + i entries (the count is what changes,
  as in test_torch's test_index_reduce_* cases);
- `index_reduce_prod`: the same with index_reduce_(..., "prod", include_self=False)
  (JAX: `.at[].multiply` over ones, then merged where indexed).

torch_xla runs with its CPU fallback counted: an op it runs on the CPU (no compile) is marked.
The torch_xla side needs torch 2.9 and runs in its own venv outside .venv (see
benchmarks/bench_torch_xla.py, which creates it; `--venv` names it). Prints a markdown section;
with --out, replaces that section of the file.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from markdown_section import write_section  # benchmarks/ is the script's directory

ROOT = Path(__file__).resolve().parents[1]
PROJECT_PYTHON = ROOT / ".venv" / "bin" / "python"
OPS = ["add+mul", "softmax", "index_add_", "index_reduce_prod"]
BEGIN, END = "<!-- bench_first_call_peers: begin -->", "<!-- bench_first_call_peers: end -->"


# ---- the sides (each in its own process) --------------------------------------------------------


def _torch_inputs(op: str, i: int):
    import torch

    g = torch.Generator().manual_seed(i)
    if op == "add+mul":
        return (torch.randn(1001 + i, generator=g),)
    if op == "softmax":
        return (torch.randn(4, 250 + i, generator=g),)
    k = 1 + i
    index = torch.randint(0, 6, (k,), generator=g)
    return torch.randn(6, 5, generator=g), index, torch.randn(k, 5, generator=g)


def _torch_call(op: str, args):
    import torch

    if op == "add+mul":
        (x,) = args
        return (x + 1) * x
    if op == "softmax":
        return torch.softmax(args[0], -1)
    x, index, src = args
    if op == "index_add_":
        return x.clone().index_add_(0, index, src)
    return x.clone().index_reduce_(0, index, src, "prod", include_self=False)


def _time_op(op: str, shapes: int, sync, to_device) -> dict:
    """One op at `shapes` new shapes, then once more at the last one (a cache hit)."""
    times = []
    for i in range(shapes + 1):
        args = tuple(to_device(a) for a in _torch_inputs(op, min(i, shapes - 1)))
        sync()
        t0 = time.perf_counter()
        r = _torch_call(op, args)
        r.cpu()  # the result on the host: every side's synchronizing point
        times.append(time.perf_counter() - t0)
    return {"first": times[:shapes], "hit": times[shapes]}


def _time_torch(shapes: int, sync, to_device) -> dict:
    return {op: _time_op(op, shapes, sync, to_device) for op in OPS}


def side_cpu(shapes: int) -> dict:
    import torch

    torch.set_num_threads(2)
    return {"version": f"torch {torch.__version__}",
            "ops": _time_torch(shapes, lambda: None, lambda t: t)}


def side_tpu(shapes: int) -> dict:
    import torch

    import torch_pjrt  # noqa: F401  (autoloaded too)

    torch.set_num_threads(2)
    ops = _time_torch(shapes, torch.tpu.synchronize, lambda t: t.to("tpu"))
    return {"version": f"torch {torch.__version__}, torch_pjrt (Strict, plugin "
                       f"{torch.tpu.get_device_name()})", "ops": ops}


def side_xla(shapes: int) -> dict:
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    torch.set_num_threads(2)
    dev = torch_xla.device()

    def sync():
        torch_xla.sync()
        xm.wait_device_ops()

    ops = {}
    for op in OPS:
        met.clear_all()
        ops[op] = _time_op(op, shapes, sync, lambda t: t.to(dev))
        ops[op]["fallbacks"] = sorted(set(met.executed_fallback_ops()))
    return {"version": f"torch_xla {torch_xla.__version__} on torch {torch.__version__}",
            "ops": ops}


def side_jax(shapes: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    def fns(op):
        if op == "add+mul":
            return lambda x: (x + 1) * x
        if op == "softmax":
            return lambda x: jax.nn.softmax(x, axis=-1)
        if op == "index_add_":
            return lambda x, idx, src: x.at[idx].add(src)

        def prod(x, idx, src):  # include_self=False: the product of what lands, else x
            p = jnp.ones_like(x).at[idx].multiply(src)
            hit = jnp.zeros(x.shape[0], bool).at[idx].set(True)
            return jnp.where(hit[:, None], p, x)
        return prod

    ops = {}
    for op in OPS:
        fn = jax.jit(fns(op))  # one jitted function per op: its cache is keyed by shape
        times = []
        for i in range(shapes + 1):
            args = [jnp.asarray(a.numpy()) for a in _torch_inputs(op, min(i, shapes - 1))]
            for a in args:
                a.block_until_ready()
            t0 = time.perf_counter()
            r = fn(*args)
            np.asarray(r)
            times.append(time.perf_counter() - t0)
        ops[op] = {"first": times[:shapes], "hit": times[shapes]}
    return {"version": f"jax {jax.__version__}", "ops": ops}


SIDES = {"cpu": side_cpu, "tpu": side_tpu, "xla": side_xla, "jax": side_jax}


# ---- the driver ----------------------------------------------------------------------------------


def run_side(side: str, python: str, shapes: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="2")
    if side == "xla":
        env.update(PJRT_DEVICE="CPU")
        for k in ("TORCH_PJRT_PLUGIN", "PYTHONPATH"):
            env.pop(k, None)
    if side == "tpu":
        env["TORCH_PJRT_CACHE_DIR"] = tempfile.mkdtemp(prefix="first_call_cache_")
        env["TORCH_PJRT_PLUGIN"] = "cpu"
    if side == "jax":
        env["JAX_PLATFORMS"] = "cpu"
        env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    r = subprocess.run([python, __file__, "--side", side, "--shapes", str(shapes)],
                       capture_output=True, text=True, env=env, cwd=str(ROOT / "benchmarks"))
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode != 0 or not line:
        sys.exit(f"side {side} failed (exit {r.returncode}):\n{(r.stdout + r.stderr)[-4000:]}")
    return json.loads(line[-1][len("RESULT "):])


def _ms(v: float) -> str:
    return f"{v * 1e3:.1f}" if v >= 1e-3 else f"{v * 1e3:.3f}"


def report(results: dict, shapes: int, cmd: str) -> str:
    names = {"cpu": "CPU eager", "tpu": "torch_pjrt", "xla": "PyTorch/XLA", "jax": "JAX jit"}
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [BEGIN, "## First calls at new shapes, against the peers that compile through XLA",
             "", f"Measured by `{cmd}` on this machine's CPU (2 cores, OMP_NUM_THREADS=2, "
             f"torch.set_num_threads(2); load average at the end {load}). Sides: "
             + "; ".join(f"{names[s]}: {results[s]['version']}" for s in results) + ". "
             f"Each side in a fresh process (torch_pjrt with an empty compile cache; JAX's "
             f"persistent cache off); each op called once at each of {shapes} shapes never seen "
             "before, synchronized (result copied to the host), then once more at the last "
             "shape (*hit*). Times in ms: median and p90 of the first calls.", "",
             "| op | " + " | ".join(f"{names[s]} first, median / p90" for s in results)
             + " | " + " | ".join(f"{names[s]} hit" for s in results) + " |",
             "|---|" + "---:|" * (2 * len(results))]
    notes = []
    for op in OPS:
        cells, hits = [], []
        for s, res in results.items():
            o = res["ops"][op]
            f = sorted(o["first"])
            p90 = f[min(len(f) - 1, int(round(0.9 * (len(f) - 1))))]
            cells.append(f"{_ms(statistics.median(f))} / {_ms(p90)}")
            hits.append(_ms(o["hit"]))
            if o.get("fallbacks"):
                notes.append(f"PyTorch/XLA ran `{op}` with CPU fallbacks: "
                             f"{', '.join(o['fallbacks'])} (no compile for those)")
        lines.append(f"| {op} | " + " | ".join(cells) + " | " + " | ".join(hits) + " |")
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    lines.append(END)
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--side", choices=sorted(SIDES), help=argparse.SUPPRESS)
    p.add_argument("--shapes", type=int, default=12)
    p.add_argument("--venv", default="/work/venv-torch-xla")
    p.add_argument("--out")
    args = p.parse_args()
    if args.side:
        print("RESULT " + json.dumps(SIDES[args.side](args.shapes)), flush=True)
        return
    xla_python = str(Path(args.venv) / "bin" / "python")
    results = {}
    for side in ("cpu", "tpu", "xla", "jax"):
        python = xla_python if side == "xla" else str(PROJECT_PYTHON)
        if side == "xla" and not os.path.exists(python):
            print(f"# no {python}: run benchmarks/bench_torch_xla.py --setup-only first; "
                  "PyTorch/XLA left out", flush=True)
            continue
        print(f"# {side} ...", flush=True)
        results[side] = run_side(side, python, args.shapes)
    cmd = "python3 benchmarks/bench_first_call_peers.py" + (
        f" --shapes {args.shapes}" if args.shapes != 12 else "")
    section = report(results, args.shapes, cmd)
    print(section)
    if args.out:
        write_section(args.out, BEGIN, END, section)


if __name__ == "__main__":
    main()
