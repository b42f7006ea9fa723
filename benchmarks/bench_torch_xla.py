"""PyTorch/XLA comparison: the tiny-GPT training step under torch_xla 2.9's `openxla`
torch.compile backend (and its lazy and eager modes) against torch_pjrt's
torch.compile(backend="tpu") (and Strict eager), on this machine's CPU.

Usage: python3 benchmarks/bench_torch_xla.py [--quick] [--out docs/performance.md]
                                              [--venv /work/venv-torch-xla]

torch_xla 2.9 needs torch 2.9, while torch_pjrt is built for the project's torch, so the
torch_xla side runs in a virtual environment of its own, OUTSIDE the project's .venv (created
with `python3 -m venv` and filled with `pip install torch==2.9.0 torch-xla==2.9.0` when
missing). Both sides run the same step on the same model file: torch_pjrt/_models.py is loaded
by path (it needs only torch), so the torch_xla environment never imports torch_pjrt.

One step: host->device batch copy, opt.zero_grad(), loss = model(x, y), loss.backward(),
opt.step() (AdamW, lr 3e-3), loss.item(). TinyGPT(vocab, layers=2 and 6), batch 8, block 32,
d 64, 4 heads, init_weights(seed=0), batches from CharDataset(zen_corpus(), block=32) with
torch.Generator().manual_seed(0). Each row runs in a fresh process (so `first step` includes
tracing and compiling there); torch_pjrt's persistent compile cache points at an empty
temporary directory, so its first step compiles cold like torch_xla's. torch_xla runs with
PJRT_DEVICE=CPU (its CPU client); torch_pjrt with TORCH_PJRT_PLUGIN=cpu (libtpu is never
loaded on either side).

Prints a markdown section; with --out, replaces that section of the file (or appends it).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from markdown_section import write_section  # benchmarks/ is the script's directory

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "torch_pjrt" / "_models.py"
PROJECT_PYTHON = ROOT / ".venv" / "bin" / "python"
DEFAULT_VENV = "/work/venv-torch-xla"
PACKAGES = ("torch==2.9.0", "torch-xla==2.9.0")
BEGIN, END = "<!-- bench_torch_xla: begin -->", "<!-- bench_torch_xla: end -->"

# The code each measuring process runs: `python -c CHILD SIDE MODE LAYERS STEPS WARMUP MODELS`.
# It prints one line `RESULT {json}`; on failure, `RESULT {"error": ...}` where it can.
CHILD = r'''
import importlib.util, json, os, statistics, sys, time, traceback

side, mode, layers, steps, warmup, models_path = sys.argv[1:7]
layers, steps, warmup = int(layers), int(steps), int(warmup)
out = {"side": side, "mode": mode, "layers": layers}


def emit():
    print("RESULT " + json.dumps(out), flush=True)


try:
    t_start = time.perf_counter()
    import torch

    spec = importlib.util.spec_from_file_location("bench_models", models_path)
    _models = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = _models  # Dynamo looks modules up by name
    spec.loader.exec_module(_models)
    out["torch"] = torch.__version__
    out["threads"] = torch.get_num_threads()

    if side == "xla":
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.debug.metrics as met

        out["torch_xla"] = getattr(torch_xla, "__version__", "?")
        device = torch_xla.device() if hasattr(torch_xla, "device") else xm.xla_device()
        sync = torch_xla.sync if hasattr(torch_xla, "sync") else xm.mark_step
        if mode == "eager":
            eager_mode = getattr(getattr(torch_xla, "experimental", None), "eager_mode", None)
            if eager_mode is None:
                raise RuntimeError("torch_xla.experimental.eager_mode does not exist in this "
                                   "torch_xla")
            eager_mode(True)

        def counts():  # eager mode records its per-op programs under EagerOp*
            n = lambda name: (met.metric_data(name) or (0,))[0]  # noqa: E731
            return (n("CompileTime") + n("EagerOpCompileTime"),
                    n("ExecuteTime") + n("EagerOpExecuteTime"))
    else:
        import torch_pjrt  # noqa: F401

        device = torch.device("tpu")
        out["plugin"] = torch.tpu.get_device_name()
        torch.tpu.set_eager_mode("strict")

        def counts():
            m = torch.tpu.metrics()
            return m["compiles"], m["executions"]

    data = _models.CharDataset(_models.zen_corpus(), block=32)
    g = torch.Generator().manual_seed(0)
    batches = [data.batch(8, g) for _ in range(warmup + steps)]
    model = _models.init_weights(_models.TinyGPT(data.vocab, layers=layers), seed=0).to(device)
    # torch_pjrt: capturable keeps AdamW's step counters on the device, so its compiled
    # optimizer graph has no CPU inputs; torch_xla: AdamW's defaults.
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, capturable=(side == "pjrt"))
    out["capturable"] = side == "pjrt"

    def step(x, y):
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        return loss

    if mode == "lazy":
        def run(x, y):
            loss = step(x, y)
            sync()  # cut and run the lazy graph (torch_xla.sync() / xm.mark_step())
            return loss
    elif mode == "compiled":
        import torch._dynamo
        from torch._dynamo.utils import counters

        torch._dynamo.reset()
        run = torch.compile(step, backend="openxla" if side == "xla" else "tpu")
    else:  # eager (torch_xla eager mode) or strict (torch_pjrt Strict eager)
        run = step

    times, losses = [], []
    for i, (x, y) in enumerate(batches):
        if i == warmup:
            c0 = counts()
        t0 = time.perf_counter_ns()
        loss = run(x.to(device), y.to(device)).item()
        dt = time.perf_counter_ns() - t0
        losses.append(loss)
        if i == 0:
            out["first_s"] = dt / 1e9
            out["first_from_start_s"] = time.perf_counter() - t_start
        if i >= warmup:
            times.append(dt)
    c1 = counts()
    out["ms"] = statistics.median(times) / 1e6
    out["min_ms"] = min(times) / 1e6
    out["compiles_per_step"] = (c1[0] - c0[0]) / steps
    out["executions_per_step"] = (c1[1] - c0[1]) / steps
    out["compiles_total"] = c1[0]
    out["loss_first"], out["loss_last"] = losses[0], losses[-1]
    if mode == "compiled":
        out["dynamo_graphs"] = counters["stats"]["unique_graphs"]
        out["graph_breaks"] = sum(counters["graph_break"].values())
        out["graph_break_reasons"] = sorted({" ".join(r.split("Hint:")[0].split())[:240]
                                             for r in counters["graph_break"]})
except BaseException as e:  # report, never a number
    out["error"] = f"{type(e).__name__}: {e}".strip()
    out["traceback"] = traceback.format_exc()[-3000:]
emit()
'''


def ensure_venv(venv: Path, python: str) -> tuple[Path, float]:
    """Create VENV and install PACKAGES into it if they are not there; returns its python and
    the seconds spent installing (0 when nothing was needed)."""
    if venv.resolve() == (ROOT / ".venv").resolve() or ROOT / ".venv" in venv.resolve().parents:
        sys.exit(f"--venv {venv} is the project's own .venv: torch_xla must not go there")
    vpy = venv / "bin" / "python"
    want = {p.split("==")[0]: p.split("==")[1] for p in PACKAGES}
    if vpy.exists():
        r = subprocess.run([str(vpy), "-c", "import importlib.metadata as m, json, sys\n"
                            "v = {}\n"
                            f"for n in {list(want)!r}:\n"
                            "    try: v[n] = m.version(n)\n"
                            "    except m.PackageNotFoundError: v[n] = None\n"
                            "print(json.dumps(v))"], capture_output=True, text=True)
        have = json.loads(r.stdout) if r.returncode == 0 else {}
        if all((have.get(n) or "").split("+")[0] == v for n, v in want.items()):
            print(f"# {venv}: {', '.join(f'{n} {have[n]}' for n in want)} already installed",
                  flush=True)
            return vpy, 0.0
    t0 = time.perf_counter()
    if not vpy.exists():
        print(f"# creating the virtual environment {venv} ({python} -m venv)", flush=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
    cmd = [str(vpy), "-m", "pip", "install", *PACKAGES]
    print(f"# installing {' '.join(PACKAGES)} into {venv}: {' '.join(cmd)}", flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = r.stdout
    if r.returncode != 0:
        sys.exit(f"pip install failed (exit {r.returncode}):\n{log[-4000:]}")
    done = [ln for ln in log.splitlines() if ln.startswith("Successfully installed")]
    print("# " + (done[-1] if done else "pip: nothing new installed"), flush=True)
    dt = time.perf_counter() - t0
    print(f"# install took {dt:.0f} s", flush=True)
    return vpy, dt


def measure(python: Path, side: str, mode: str, layers: int, steps: int, warmup: int,
            timeout: float) -> dict:
    env = {**os.environ}
    env.pop("PYTHONPATH", None)
    tmp = None
    if side == "xla":
        env["PJRT_DEVICE"] = "CPU"
        env.pop("TPU_LIBRARY_PATH", None)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="bench_torch_xla_cache_")
        env["TORCH_PJRT_PLUGIN"] = "cpu"
        env["TORCH_PJRT_CACHE_DIR"] = tmp.name
    cmd = [str(python), "-c", CHILD, side, mode, str(layers), str(steps), str(warmup),
           str(MODELS)]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                           cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return {"side": side, "mode": mode, "layers": layers,
                "error": f"timed out after {timeout:.0f} s"}
    finally:
        if tmp is not None:
            tmp.cleanup()
    wall = time.perf_counter() - t0
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if not line:
        tail = (r.stderr or r.stdout).strip().splitlines()[-15:]
        return {"side": side, "mode": mode, "layers": layers,
                "error": f"process exited {r.returncode} without a result: " + " | ".join(tail)}
    res = json.loads(line[-1][len("RESULT "):])
    res["wall_s"] = wall
    if "error" in res:
        res["stderr_tail"] = r.stderr[-3000:]
    return res


ROWS = (  # (side, mode, label)
    ("pjrt", "compiled", 'torch_pjrt, torch.compile(backend="tpu")'),
    ("pjrt", "strict", "torch_pjrt, Strict eager"),
    ("xla", "compiled", 'torch_xla, torch.compile(backend="openxla")'),
    ("xla", "lazy", "torch_xla, lazy (torch_xla.sync() per step)"),
    ("xla", "eager", "torch_xla, eager_mode(True)"),
)


def _md_cell(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|").replace("`", "'")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def report(results: dict, steps: int, warmup: int, install_s: float, venv: Path) -> str:
    any_of = lambda side, key: next((r[key] for r in results.values()  # noqa: E731
                                     if r["side"] == side and key in r), "?")
    load = os.getloadavg()
    lines = [
        BEGIN,
        "# PyTorch/XLA comparison: tiny-GPT training step on the CPU",
        "",
        f"Measured by `benchmarks/bench_torch_xla.py` on this machine's CPU ({os.cpu_count()} "
        f"cores, load average at the end {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}). "
        f"torch_pjrt: torch {any_of('pjrt', 'torch')}, PJRT `{any_of('pjrt', 'plugin')}`, "
        f"torch.get_num_threads() = {any_of('pjrt', 'threads')}. torch_xla: torch_xla "
        f"{any_of('xla', 'torch_xla')} on torch {any_of('xla', 'torch')} (venv `{venv}`), "
        f"PJRT_DEVICE=CPU, torch.get_num_threads() = {any_of('xla', 'threads')} (XLA's CPU "
        "client runs its own thread pool on either side). One step: host->device batch copy, "
        "zero_grad, forward, backward, AdamW (lr 3e-3), loss.item(); for the compiled rows "
        "the whole step function is passed to torch.compile. Batch 8, block 32, d 64, 4 heads. "
        f"Median of {steps} steps after {warmup} warm-up steps; each row in a fresh process.",
        "",
        "| layers | how | step (ms) | vs torch_pjrt compiled | compiles per timed step | "
        "programs run per step | Dynamo graphs / breaks | first step (s) | loss after last step |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    errors = []
    for layers in (2, 6):
        base = results.get(("pjrt", "compiled", layers), {}).get("ms")
        for side, mode, label in ROWS:
            r = results[(side, mode, layers)]
            if "error" in r:
                errors.append((layers, label, r))
                lines.append(f"| {layers} | {label} | failed: {_md_cell(r['error'])} | | | | | | |")
                continue
            ratio = f"{r['ms'] / base:.2f}x" if base else "n/a"
            dyn = (f"{r['dynamo_graphs']} / {r['graph_breaks']}" if "dynamo_graphs" in r else "")
            lines.append(f"| {layers} | {label} | {r['ms']:.2f} | {ratio} | "
                         f"{r['compiles_per_step']:.1f} | {r['executions_per_step']:.1f} | "
                         f"{dyn} | {r['first_s']:.1f} | {r['loss_last']:.4f} |")
    lines += [
        "",
        "`vs torch_pjrt compiled` is the row's step time over torch_pjrt's compiled step time "
        "at the same depth (below 1 is faster than torch_pjrt). `compiles per timed step` "
        "(XLA programs compiled during the timed steps; 0 = no recompiles) and `programs run "
        "per step` come from torch_xla's CompileTime/ExecuteTime (eager mode: EagerOpCompileTime/EagerOpExecuteTime) metrics and from "
        "torch.tpu.metrics(). `Dynamo graphs / breaks`: torch._dynamo's unique graphs and "
        "graph-break count in that process. `first step` is the first call alone (tracing, "
        "compiling), with cold caches. `loss after last step`: the same data and initial weights "
        "on every row, so it should agree across rows of a depth. torch_pjrt's AdamW uses capturable=True (its compiled "
        "optimizer graph needs device-side step counters); torch_xla's uses the defaults.",
    ]
    breaks = {r["layers"]: r.get("graph_break_reasons") for (s, m, _), r in results.items()
              if s == "xla" and m == "compiled" and r.get("graph_break_reasons")}
    if breaks:
        reasons = sorted({x for v in breaks.values() for x in v})
        lines += ["", "openxla graph-break reasons reported by Dynamo (the compiled step runs as "
                  "separate pieces around them): " +
                  "; ".join(f"\"{_md_cell(x, 200)}\"" for x in reasons) + "."]
    if errors:
        lines += ["", "Failures (error text as raised):", ""]
        for layers, label, r in errors:
            lines.append(f"- layers {layers}, {label}: {_md_cell(r['error'], 600)}")
    if install_s:
        lines += ["", f"Installing {' and '.join(PACKAGES)} into the venv took "
                  f"{install_s:.0f} s in this run."]
    lines += ["", END, ""]
    return "\n".join(lines)


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="replace (or append) this section in the markdown file")
    p.add_argument("--quick", action="store_true", help="10 steps after 3 warm-up steps")
    p.add_argument("--steps", type=int, help="timed steps (default 30; --quick 10)")
    p.add_argument("--warmup", type=int, help="warm-up steps (default 5; --quick 3)")
    p.add_argument("--venv", default=DEFAULT_VENV,
                   help=f"virtual environment for torch_xla (default {DEFAULT_VENV})")
    p.add_argument("--python", default=shutil.which("python3") or sys.executable,
                   help="interpreter that creates the venv (python3 -m venv)")
    p.add_argument("--project-python", default=str(PROJECT_PYTHON),
                   help="interpreter with torch_pjrt (default the project's .venv)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per measuring process")
    p.add_argument("--setup-only", action="store_true", help="create the venv, then stop")
    args = p.parse_args(argv)
    steps, warmup = (10, 3) if args.quick else (30, 5)
    steps = args.steps or steps
    warmup = args.warmup if args.warmup is not None else warmup

    t_all = time.perf_counter()
    xla_python, install_s = ensure_venv(Path(args.venv), args.python)
    if args.setup_only:
        return ""
    pythons = {"pjrt": Path(args.project_python), "xla": xla_python}
    results = {}
    for layers in (2, 6):
        for side, mode, label in ROWS:
            t0 = time.perf_counter()
            r = measure(pythons[side], side, mode, layers, steps, warmup, args.timeout)
            results[(side, mode, layers)] = r
            what = (f"failed: {r['error']}" if "error" in r else
                    f"{r['ms']:.2f} ms/step, first step {r['first_s']:.1f} s, loss "
                    f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}")
            print(f"# layers {layers}, {label}: {what} ({time.perf_counter() - t0:.0f} s)",
                  flush=True)
            if "error" in r and r.get("traceback"):
                print("#   " + r["traceback"].strip().replace("\n", "\n#   "), flush=True)
    section = report(results, steps, warmup, install_s, Path(args.venv))
    print(section)
    print(f"# total {time.perf_counter() - t_all:.0f} s (install {install_s:.0f} s)")
    if args.out:
        write_section(args.out, BEGIN, END, section)
    return section


if __name__ == "__main__":
    main()
