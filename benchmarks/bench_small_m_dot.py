"""Decode-sized matrix products: XLA's CPU dot at a few rows against CPU torch (measured only).

    python benchmarks/bench_small_m_dot.py [--rows 1,2,8]

The ~100M serving model's decode step (docs/serving-performance.md) is bound by its matrix
products at 1 to 8 rows. This times, per row count M, one compiled program holding the 48 linear
layers of that model's 12 decoder layers (768->1280, 768->768, 768->4096, 2048->768; weights
stored column-major, as the vLLM plugin stores them) and one holding its LM head (768->32000),
each call followed by a read-back (median of 15 calls after 3 warm-ups), beside CPU torch's
`F.linear` with [out, in] contiguous weights (median of 10). Run it with XLA_FLAGS to compare the
plugin's dot back ends (the program cache's key includes XLA_FLAGS, so each flag set compiles its
own programs). It also prints the largest relative difference from CPU.
"""

import argparse
import time

import torch
import torch.nn.functional as F

SHAPES = [(768, 1280), (768, 768), (768, 4096), (2048, 768)]  # (in, out) of one decoder layer
LAYERS = 12
VOCAB = 32000


def _inputs(x):
    """The input of each layer's linear: x for 768-wide ones, a 2048-wide row for the down proj."""
    return x, torch.cat([x, x, x[:, :512]], 1)


def layer_products(x, *weights):
    x768, x2048 = _inputs(x)
    return torch.stack([F.linear(x768 if w.shape[1] == 768 else x2048, w).sum(1) for w in weights])


def lm_head(x, w):
    return F.linear(x, w)


def _median_ms(fn, calls, warm=3):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2] * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,2,8")
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    # [out, in] views of contiguous [in, out] buffers on tpu (column-major, the plugin's layout);
    # plain contiguous [out, in] on CPU (PyTorch's layout).
    host = [torch.randn(k, n) for _ in range(LAYERS) for k, n in SHAPES]
    head = torch.randn(768, VOCAB)
    dev = [w.to("tpu").t() for w in host]
    dev_head = head.to("tpu").t()
    cpu = [w.t().contiguous() for w in host]
    cpu_head = head.t().contiguous()
    layers_c = torch.compile(layer_products, backend="tpu")
    head_c = torch.compile(lm_head, backend="tpu")
    print(f"threads: torch {torch.get_num_threads()}; the XLA CPU plugin uses its own pool")
    print("rows | tpu: 48 layer products | tpu: LM head | CPU torch: 48 | CPU torch: LM head | max rel diff")
    for m in [int(r) for r in args.rows.split(",")]:
        x = torch.randn(m, 768)
        xd = x.to("tpu")
        t_layers = _median_ms(lambda: layers_c(xd, *dev).cpu(), 15)
        t_head = _median_ms(lambda: head_c(xd, dev_head).cpu(), 15)
        c_layers = _median_ms(lambda: layer_products(x, *cpu), 10)
        c_head = _median_ms(lambda: lm_head(x, cpu_head), 10)
        ref = layer_products(x, *cpu)
        got = layers_c(xd, *dev).cpu()
        rel = float((got - ref).abs().max() / ref.abs().max())
        print(f"{m} | {t_layers:.2f} ms | {t_head:.2f} ms | {c_layers:.2f} ms | {c_head:.2f} ms | {rel:.1e}",
              flush=True)


if __name__ == "__main__":
    main()
