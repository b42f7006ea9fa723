"""torch.compile(backend="tpu") benchmark: the tiny-GPT training step (forward, backward, AdamW,
host->device batch copy, loss.item()) compiled on tpu, against the tpu eager modes (Strict,
DeferAndFuse), CPU eager and CPU Inductor, in one run; and the time to the first compiled step
in a fresh process with a cold and a warm persistent cache.

Usage: python benchmarks/bench_compile.py [--out docs/performance.md] [--quick]
Prints a markdown section; with --out, replaces that section of the file (or appends it).
Threads: PyTorch's defaults (torch.get_num_threads() is printed); nothing else should run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import torch

import torch_pjrt  # noqa: F401  (autoload does this too; explicit for a plain checkout)
from torch_pjrt import _models

from markdown_section import write_section  # benchmarks/ is the script's directory

TPU = torch.device("tpu")
BEGIN, END = "<!-- bench_compile: begin -->", "<!-- bench_compile: end -->"


def _setup(device, n, layers):
    data = _models.CharDataset(_models.zen_corpus(), block=32)
    g = torch.Generator().manual_seed(0)
    batches = [data.batch(8, g) for _ in range(n)]
    model = _models.init_weights(_models.TinyGPT(data.vocab, layers=layers), seed=0).to(device)
    # capturable: AdamW keeps its step counters on the device, so the compiled optimizer
    # graph has no CPU inputs (on the CPU it changes nothing)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, capturable=device.type == "tpu")
    return model, opt, batches


def step_times(kind: str, steps: int, warmup: int, layers: int):
    """Median step time (ms), first-step time (s) and per-step counters for one way of running."""
    device = torch.device("cpu") if kind.startswith("cpu") else TPU
    model, opt, batches = _setup(device, warmup + steps, layers)

    def step(x, y):
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        return loss

    backend = {"compiled": "tpu", "cpu_inductor": "inductor"}.get(kind)
    if backend:
        torch._dynamo.reset()
        step = torch.compile(step, backend=backend)
    mode = {"strict": "strict", "defer_and_fuse": "defer_and_fuse"}.get(kind, "strict")
    torch.tpu.set_eager_mode(mode)
    times, first = [], None
    try:
        for i, (x, y) in enumerate(batches):
            if i == warmup:
                m0 = torch.tpu.metrics()
            t0 = time.perf_counter_ns()
            step(x.to(device), y.to(device)).item()
            dt = time.perf_counter_ns() - t0
            if i == 0:
                first = dt / 1e9
            if i >= warmup:
                times.append(dt)
    finally:
        torch.tpu.set_eager_mode("strict")
    m1 = torch.tpu.metrics()
    per_step = {k: (m1[k] - m0[k]) / steps for k in
                ("executions", "compiles", "cpu_fallbacks", "graph_runs", "defer_ops")}
    return statistics.median(times) / 1e6, first, per_step


FIRST_STEP = """
import time
t_start = time.perf_counter()
import torch
from torch_pjrt import _models
t_import = time.perf_counter()
if {llama}:
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers={layers}, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to("tpu")
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 128, (4, 32), generator=g)
    y = x.clone()
    def loss_of(x, y):
        return model(input_ids=x, labels=y).loss
else:
    data = _models.CharDataset(_models.zen_corpus(), block=32)
    x, y = data.batch(8, torch.Generator().manual_seed(0))
    model = _models.init_weights(_models.TinyGPT(data.vocab, layers={layers}), seed=0).to("tpu")
    def loss_of(x, y):
        return model(x, y)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, capturable=True)
@torch.compile(backend="tpu")
def step(x, y):
    opt.zero_grad()
    loss = loss_of(x, y)
    loss.backward()
    opt.step()
    return loss
t0 = time.perf_counter()
step(x.to("tpu"), y.to("tpu")).item()
t1 = time.perf_counter()
m = torch.tpu.metrics()
from torch._dynamo.utils import compilation_time_metrics as ctm
dynamo = sum(ctm.get("_compile.compile_inner", [0.0]))
aot = sum(ctm.get("create_aot_dispatcher_function", [0.0]))
print("RESULT", t1 - t_start, t1 - t0, m["compiles"], m["compile_ns"] / 1e9, m["disk_cache_hits"],
      m["graph_captures"], t_import - t_start, dynamo - aot, aot)
"""

# The same first step through PyTorch's ahead-of-time compilation: the loss function (forward
# and backward graphs) is `torch.compile(..., fullgraph=True).aot_compile`d and saved by the cold
# run; a warm run loads it (`torch.compiler.load_compiled_function`: no Dynamo, no AOTAutograd)
# and its programs from the persistent cache. The optimizer step runs eagerly (Strict).
PRECOMPILED_STEP = """
import os, time
t_start = time.perf_counter()
import torch
from torch_pjrt import _models
t_import = time.perf_counter()
data = _models.CharDataset(_models.zen_corpus(), block=32)
x, y = data.batch(8, torch.Generator().manual_seed(0))
model = _models.init_weights(_models.TinyGPT(data.vocab, layers={layers}), seed=0).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, capturable=True)
def loss_of(m, x, y):
    return m(x, y)
path = os.path.join(os.environ["TORCH_PJRT_CACHE_DIR"], "loss_of.aot")
t0 = time.perf_counter()
if os.path.exists(path):
    with open(path, "rb") as f:
        fn = torch.compiler.load_compiled_function(f)
else:
    fn = torch.compile(loss_of, fullgraph=True, backend="tpu").aot_compile(
        ((model, x.to("tpu"), y.to("tpu")), {{}}))
    fn.save_compiled_function(path)
opt.zero_grad()
loss = fn(model, x.to("tpu"), y.to("tpu"))
loss.backward()
opt.step()
loss.item()
t1 = time.perf_counter()
m = torch.tpu.metrics()
from torch._dynamo.utils import compilation_time_metrics as ctm
dynamo = sum(ctm.get("_compile.compile_inner", [0.0]))
aot = sum(ctm.get("create_aot_dispatcher_function", [0.0]))
print("RESULT", t1 - t_start, t1 - t0, m["compiles"], m["compile_ns"] / 1e9, m["disk_cache_hits"],
      m["graph_captures"], t_import - t_start, dynamo - aot, aot)
"""

# (label, layers, kind) of the fresh-process first-step runs; kind: "gpt" or "llama" through
# torch.compile (FIRST_STEP), with "+dynamo-cache" under PyTorch's Dynamo cache
# (TORCH_CACHING_PRECOMPILE=1, torch_pjrt/compile/precompile.py), "precompiled" through
# aot_compile (PRECOMPILED_STEP)
FIRST_STEP_MODELS = (("tiny GPT, 2 layers", 2, "gpt"), ("tiny GPT, 6 layers", 6, "gpt"),
                     ("tiny GPT, 8 layers", 8, "gpt"), ("HF Llama (config), 2 layers", 2, "llama"),
                     ("HF Llama (config), 2 layers, Dynamo cache", 2, "llama+dynamo-cache"),
                     ("tiny GPT, 6 layers, Dynamo cache", 6, "gpt+dynamo-cache"),
                     ("tiny GPT, 6 layers, aot_compile + load", 6, "precompiled"))


def first_step(layers: int, cache_dir: str, kind: str = "gpt"):
    model, _, cache = kind.partition("+")
    code = (PRECOMPILED_STEP.format(layers=layers) if model == "precompiled" else
            FIRST_STEP.format(layers=layers, llama=model == "llama"))
    env = {**os.environ, "TORCH_PJRT_CACHE_DIR": cache_dir,
           # AOTAutograd's cache (option aot_cache) and Dynamo's start empty with ours
           "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache_dir, "inductor"),
           "TORCH_CACHING_PRECOMPILE": "1" if cache == "dynamo-cache" else "0"}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                       capture_output=True, text=True, timeout=900, env=env)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")]
    if r.returncode != 0 or not line:
        raise RuntimeError(f"first-step run failed:\n{r.stderr[-2000:]}")
    total, step_s, compiles, compile_s, hits, captures, imp, dynamo, aot = line[0].split()[1:]
    return (float(total), float(step_s), int(compiles), float(compile_s), int(hits),
            int(captures), float(imp), float(dynamo), float(aot))


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="replace (or append) this section in the markdown file")
    p.add_argument("--quick", action="store_true", help="fewer steps")
    args = p.parse_args(argv)
    steps, warmup = (10, 3) if args.quick else (30, 5)

    kinds = ("compiled", "strict", "defer_and_fuse", "cpu_eager", "cpu_inductor")
    names = {"compiled": "tpu, torch.compile(backend=\"tpu\")", "strict": "tpu, Strict eager",
             "defer_and_fuse": "tpu, DeferAndFuse eager", "cpu_eager": "CPU eager",
             "cpu_inductor": "CPU, torch.compile(backend=\"inductor\")"}
    rows = {}
    for layers in (2, 6):
        for kind in kinds:
            rows[(layers, kind)] = step_times(kind, steps, warmup, layers)
    firsts = {}
    for label, layers, kind in FIRST_STEP_MODELS:
        with tempfile.TemporaryDirectory(prefix="bench_compile_cache_") as d:
            cold = first_step(layers, d, kind)
            warm = [first_step(layers, d, kind) for _ in range(3)]
        firsts[label] = (cold, sorted(warm, key=lambda r: r[0])[1])

    load = os.getloadavg()
    lines = [
        BEGIN,
        "# torch.compile: tiny-GPT training step",
        "",
        f"Measured by `benchmarks/bench_compile.py` (torch {torch.__version__}, PJRT "
        f"`{torch.tpu.get_device_name()}`, {os.cpu_count()} cores, torch.get_num_threads() = "
        f"{torch.get_num_threads()}, load average at the end {load[0]:.1f}/{load[1]:.1f}/"
        f"{load[2]:.1f}). One step: host->device batch copy, zero_grad, forward, backward, "
        "AdamW, loss.item(); the whole step function is compiled (model and optimizer). Median "
        f"of {steps} steps after {warmup} warm-up steps; all rows in one process, one after the "
        "other. Batch 8, block 32, d 64, 4 heads.",
        "",
        "| layers | how | step (ms) | vs CPU eager | speedup over Strict | vs Inductor | programs run per step | graph runs per step | first step (s) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for layers in (2, 6):
        cpu = rows[(layers, "cpu_eager")][0]
        strict = rows[(layers, "strict")][0]
        ind = rows[(layers, "cpu_inductor")][0]
        for kind in kinds:
            ms, first, c = rows[(layers, kind)]
            tpu_counts = not kind.startswith("cpu")
            lines.append(
                f"| {layers} | {names[kind]} | {ms:.2f} | {ms / cpu:.2f}x | {strict / ms:.2f}x | "
                f"{ms / ind:.2f}x | {c['executions']:.0f} | "
                f"{c['graph_runs']:.0f} | {first:.1f} |" if tpu_counts else
                f"| {layers} | {names[kind]} | {ms:.2f} | {ms / cpu:.2f}x | {strict / ms:.2f}x | "
                f"{ms / ind:.2f}x | | | {first:.1f} |")
    lines += [
        "",
        "`vs CPU eager` and `vs Inductor` are time ratios (below 1 is faster); `speedup over "
        "Strict` is Strict's step time over this row's. `first step` includes Dynamo tracing, "
        "AOTAutograd and compiling (compiled rows) in this warm process.",
        "",
        "## Time to the first compiled training step in a fresh process",
        "",
        "From interpreter start to the first step's `loss.item()`, one process per run; the warm "
        "runs reuse the cold run's TORCH_PJRT_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR (programs "
        "and AOTAutograd's graphs; median of 3 by total). `first call` is "
        "the first call of the compiled step alone; within it, `Dynamo` is Dynamo's own tracing "
        "and guard building (its `_compile.compile_inner` time less AOTAutograd's), "
        "`AOTAutograd` is `create_aot_dispatcher_function` (joint-graph tracing and the min-cut "
        "partitioner), both from torch._dynamo.utils.compilation_time_metrics, and `XLA compile` "
        "is the runtime's own compile time; the rest of the first call is running the graphs "
        "(capture replay, program launch, the eager parts between graph pieces). The HF Llama "
        "step: LlamaForCausalLM from a LlamaConfig (vocab 128, hidden 64, 4 heads / 2 KV heads), "
        "batch 4 x 32 tokens, loss from `labels`, AdamW. The `aot_compile + load` row: the cold run "
        "aot-compiles the loss function (fullgraph: forward and backward graphs) and saves it, "
        "warm runs load it with `torch.compiler.load_compiled_function` (no Dynamo, no "
        "AOTAutograd) and step AdamW eagerly. The `Dynamo cache` rows: the same plain "
        "`torch.compile` step under PyTorch's Dynamo cache (`TORCH_CACHING_PRECOMPILE=1`; the cold "
        "process saves it at exit, torch_pjrt/compile/precompile.py): the warm process loads the "
        "model's frames and traces only the optimizer's, which PyTorch leaves out of that cache.",
        "",
        "| model | cache | total (s) | import torch (s) | first call (s) | Dynamo (s) | AOTAutograd (s) | XLA compile (s) | programs compiled | compile per program (s) | disk-cache hits | graphs captured |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for model, (cold, warm) in firsts.items():
        for label, r in (("cold", cold), ("warm", warm)):
            total, step_s, compiles, compile_s, hits, captures, imp, dynamo, aot = r
            per = f"{compile_s / compiles:.2f}" if compiles else ""
            # aot_compile traces outside Dynamo's compile_inner timer: no separate Dynamo figure
            dyn = f"{dynamo:.2f}" if dynamo >= 0 else "(in AOT)"
            lines.append(f"| {model} | {label} | {total:.2f} | {imp:.2f} | {step_s:.2f} | "
                         f"{dyn} | {aot:.2f} | {compile_s:.2f} | {compiles} | {per} | "
                         f"{hits} | {captures} |")
        lines.append(f"| {model} | warm / cold | {warm[0] / cold[0]:.0%} | | "
                     f"{warm[1] / cold[1]:.0%} | | | | | | | |")
    lines += ["", END, ""]
    report = "\n".join(lines)
    print(report)
    if args.out:
        write_section(args.out, BEGIN, END, report)
    return report


if __name__ == "__main__":
    main()
