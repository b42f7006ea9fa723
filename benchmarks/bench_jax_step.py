"""The tiny-GPT training step of bench_compile_attribution written in plain JAX: a baseline for
what one XLA program per step costs on this machine's CPU, with no PyTorch in the process.

The model is torch_pjrt._models.TinyGPT (d 64, 4 heads, block 32, untied LM head, no dropout)
with the same parameter shapes and computation: token + positional embedding, pre-LN blocks
(LayerNorm eps 1e-5, causal softmax attention scaled by 1/sqrt(head dim), MLP d -> 4d -> d with
tanh-approximated GELU), final LayerNorm, bias-free LM head, mean cross-entropy. AdamW is written
out as torch.optim.AdamW computes it (lr 3e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01
decoupled and applied to every parameter, biases and LayerNorm weights included). Weights are
drawn with jax.random in init_weights' scheme (randn / sqrt(fan_in) for matrices, randn * 0.02
for vectors), so values differ from torch's. The vocabulary is CharDataset's over zen_corpus()
(the function's source is taken from _models.py without importing torch); batch offsets come from
numpy's seeded generator, so the tokens differ from torch's batches but the shapes do not.

Measured per layer count, in a fresh process: the median wall time of `--steps` steps after
`--warmup` steps, each step = the host batch (8 x 32 int32) to the device with jax.device_put,
the whole step (forward, loss, backward, AdamW) as one jax.jit function with the parameters and
optimizer state donated, and float(loss); plus the first step's time (tracing and compiling).

Threads: by default XLA's CPU client sizes its thread pools from the CPUs this process may run
on. --threads N pins each child to its first N allowed CPUs (os.sched_setaffinity) before jax
is imported, which is how the pools are limited; the JSON's "threads" is the CPU count the child
ran with. XLA_FLAGS, if set, is passed through and reported.

Usage: python benchmarks/bench_jax_step.py [--layers 2 4 6 12] [--steps 30] [--warmup 5]
       [--threads N] [--check]
JAX lives in its own environment, e.g. /work/venv-jax/bin/python benchmarks/bench_jax_step.py.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch_pjrt", "_models.py")
BATCH, BLOCK, D, HEADS = 8, 32, 64, 4
LR, BETA1, BETA2, EPS, WD = 3e-3, 0.9, 0.999, 1e-8, 0.01
NO_JAX = ("bench_jax_step.py needs jax and jaxlib, which are not installed for {}; run it with "
          "an environment that has them (e.g. python3.11 -m venv /work/venv-jax && "
          "/work/venv-jax/bin/pip install jax jaxlib numpy)")


def require_jax():
    if importlib.util.find_spec("jax") is None or importlib.util.find_spec("jaxlib") is None:
        raise SystemExit(NO_JAX.format(sys.executable))


def zen_text() -> str:
    """zen_corpus() from _models.py, run from its source alone (that module imports torch)."""
    with open(MODELS, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "zen_corpus")
    import codecs

    ns = {"ast": ast, "codecs": codecs, "importlib": importlib}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), MODELS, "exec"), ns)
    return ns["zen_corpus"]()


def make_batches(n: int, seed: int = 0):
    """CharDataset's vocabulary and batch layout; offsets from numpy (not torch's generator)."""
    import numpy as np

    text = zen_text()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = np.array([stoi[c] for c in text], dtype=np.int32)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):  # same range as torch.randint(len(data) - block - 1, ...)
        ix = rng.integers(0, len(data) - BLOCK - 1, size=BATCH)
        out.append((np.stack([data[i:i + BLOCK] for i in ix]),
                    np.stack([data[i + 1:i + 1 + BLOCK] for i in ix])))
    return len(chars), out


def init_params(vocab: int, layers: int, seed: int = 0) -> dict:
    """TinyGPT's parameters under torch's names and shapes (Linear weights are (out, in))."""
    import jax

    shapes = {"tok.weight": (vocab, D), "pos.weight": (BLOCK, D)}
    for i in range(layers):
        b = f"blocks.{i}."
        shapes.update({
            b + "ln1.weight": (D,), b + "ln1.bias": (D,),
            b + "attn.qkv.weight": (3 * D, D), b + "attn.qkv.bias": (3 * D,),
            b + "attn.proj.weight": (D, D), b + "attn.proj.bias": (D,),
            b + "ln2.weight": (D,), b + "ln2.bias": (D,),
            b + "mlp.0.weight": (4 * D, D), b + "mlp.0.bias": (4 * D,),
            b + "mlp.2.weight": (D, 4 * D), b + "mlp.2.bias": (D,)})
    shapes.update({"ln.weight": (D,), "ln.bias": (D,), "head.weight": (vocab, D)})
    keys = jax.random.split(jax.random.PRNGKey(seed), len(shapes))
    return {name: jax.random.normal(k, s) * (1 / math.sqrt(s[1]) if len(s) > 1 else 0.02)
            for k, (name, s) in zip(keys, shapes.items())}


def loss_fn(p: dict, x, y, layers: int):
    import jax
    import jax.numpy as jnp

    def linear(h, name, bias=True):
        out = h @ p[name + ".weight"].T
        return out + p[name + ".bias"] if bias else out

    def layer_norm(h, name):
        mu = h.mean(-1, keepdims=True)
        var = ((h - mu) ** 2).mean(-1, keepdims=True)
        return (h - mu) * jax.lax.rsqrt(var + 1e-5) * p[name + ".weight"] + p[name + ".bias"]

    b, t = x.shape
    hd = D // HEADS
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    h = p["tok.weight"][x] + p["pos.weight"][jnp.arange(t)]
    for i in range(layers):
        pre = f"blocks.{i}."
        qkv = linear(layer_norm(h, pre + "ln1"), pre + "attn.qkv")
        q, k, v = (z.reshape(b, t, HEADS, hd).transpose(0, 2, 1, 3) for z in jnp.split(qkv, 3, -1))
        s = jnp.where(causal, q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd), -jnp.inf)
        att = jax.nn.softmax(s, axis=-1) @ v
        h = h + linear(att.transpose(0, 2, 1, 3).reshape(b, t, D), pre + "attn.proj")
        m = jax.nn.gelu(linear(layer_norm(h, pre + "ln2"), pre + "mlp.0"), approximate=True)
        h = h + linear(m, pre + "mlp.2")
    logits = linear(layer_norm(h, "ln"), "head", bias=False).reshape(b * t, -1)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, y.reshape(-1, 1), axis=-1).mean()


def make_step(layers: int):
    """One jitted step: loss and grads, then torch.optim.AdamW's update; params/state donated."""
    import jax
    import jax.numpy as jnp

    def step(params, opt, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y, layers)
        t = opt["step"] + 1
        bc1, bc2 = 1 - BETA1 ** t, 1 - BETA2 ** t
        new_p, new_m, new_v = {}, {}, {}
        for n, g in grads.items():
            m = BETA1 * opt["m"][n] + (1 - BETA1) * g
            v = BETA2 * opt["v"][n] + (1 - BETA2) * g * g
            denom = jnp.sqrt(v) / jnp.sqrt(bc2) + EPS
            new_p[n] = params[n] * (1 - LR * WD) - (LR / bc1) * m / denom
            new_m[n], new_v[n] = m, v
        return new_p, {"step": t, "m": new_m, "v": new_v}, loss

    return jax.jit(step, donate_argnums=(0, 1))


def setup(layers: int, n_batches: int):
    import jax
    import jax.numpy as jnp

    vocab, batches = make_batches(n_batches)
    params = init_params(vocab, layers)
    opt = {"step": jnp.zeros((), jnp.float32), "m": jax.tree.map(jnp.zeros_like, params),
           "v": jax.tree.map(jnp.zeros_like, params)}
    return vocab, batches, params, opt, make_step(layers)


def one(layers: int, steps: int, warmup: int) -> dict:
    import jax
    import jaxlib

    warmup = max(warmup, 1)  # the first step (compile) is one of the warm-up steps, as in torch's
    _, batches, params, opt, step = setup(layers, warmup + steps)
    walls, first = [], None
    for i, (x, y) in enumerate(batches):
        t0 = time.perf_counter_ns()
        params, opt, loss = step(params, opt, jax.device_put(x), jax.device_put(y))
        float(loss)
        ms = (time.perf_counter_ns() - t0) / 1e6
        if i == 0:
            first = ms / 1e3
        elif i >= warmup:
            walls.append(ms)
    return {"layers": layers, "wall_ms": statistics.median(walls), "first_step_s": first,
            "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "xla_flags": os.environ.get("XLA_FLAGS"), "threads": len(os.sched_getaffinity(0)),
            "device": str(jax.devices()[0])}


def check(layers: int, steps: int = 30) -> None:
    """Train `steps` steps; the loss must start near ln(vocab) and fall clearly."""
    import jax

    vocab, batches, params, opt, step = setup(layers, steps)
    losses = []
    for x, y in batches:
        params, opt, loss = step(params, opt, jax.device_put(x), jax.device_put(y))
        losses.append(float(loss))
    print(f"layers {layers}, vocab {vocab} (ln {math.log(vocab):.3f}), losses:",
          " ".join(f"{v:.3f}" for v in losses))
    first, last = statistics.mean(losses[:3]), statistics.mean(losses[-3:])
    assert abs(losses[0] - math.log(vocab)) < 0.5, (losses[0], math.log(vocab))
    assert last < first - 0.5, f"loss did not fall: first 3 mean {first:.3f}, last 3 {last:.3f}"
    print(f"check ok: mean of first 3 {first:.3f} -> last 3 {last:.3f}")


def pin_threads(n: int) -> None:
    if n:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:n])


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, nargs="*", default=[2, 4, 6, 12])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="CPUs each child may use (affinity)")
    p.add_argument("--check", action="store_true", help="train 30 steps, assert the loss falls")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    require_jax()
    if args.child is not None:
        pin_threads(args.threads)
        print(json.dumps(one(args.child, args.steps, args.warmup)), flush=True)
        return ""
    if args.check:
        pin_threads(args.threads)
        for layers in args.layers:
            check(layers)
        return ""
    results = []
    for layers in args.layers:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(layers),
                              "--steps", str(args.steps), "--warmup", str(args.warmup),
                              "--threads", str(args.threads)],
                             check=True, capture_output=True, text=True)
        line = out.stdout.strip().splitlines()[-1]
        print(line, flush=True)
        results.append(json.loads(line))
    r0 = results[0]
    load = os.getloadavg()
    lines = ["", f"JAX {r0['jax']} (jaxlib {r0['jaxlib']}, {r0['device']}), {os.cpu_count()} "
             f"cores, CPUs per child {r0['threads']}, XLA_FLAGS={r0['xla_flags']!r}, load average "
             f"at the end {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}; median of {args.steps} "
             f"steps after {args.warmup} warm-up steps.", "",
             "| layers | JAX step (ms) | first step (s) |", "|---:|---:|---:|"]
    lines += [f"| {r['layers']} | {r['wall_ms']:.2f} | {r['first_step_s']:.2f} |" for r in results]
    report = "\n".join(lines)
    print(report)
    return report


if __name__ == "__main__":
    main()
