"""A cost model of one training step of Llama-3-8B (FSDP2 + tensor parallelism, sequence 8192)
from 1 to 8,192 chips, on the communication pattern this implementation issues (issue 36,
item 6). Nothing here is measured: every output is computed from the formulas and the
published figures below (docs/scaling.md cites them); `python benchmarks/scaling_model.py`
prints the tables of docs/scaling.md.

The communication pattern is the one counted in a real traced step by
benchmarks/collective_census.py (FSDP2 over "dp", Megatron-style TP over "tp", no sequence
parallelism), per transformer layer per step and per chip:

  FSDP (dp group, d ranks)   forward  1 all_gather     of the layer's local params (bf16)
                             backward 1 all_gather     again (reshard_after_forward=True)
                             backward 1 reduce_scatter of the layer's grads (fp32 reduce)
  TP (tp group, t ranks)     forward  2 all_reduce     of [b, s, hidden] activations (bf16)
                             backward 5 all_reduce     one per ColwiseParallel module (q, k, v,
                                                       gate, up) of its input gradient
  root unit (embeddings, final norm, lm_head): forward 1 all_gather, backward 1 reduce_scatter
  (the root is not resharded after forward).

Collective times (n ranks, B = bytes a rank sends per second on the collective's links,
alpha = per-hop latency):
  ring all_gather(out bytes X)      (n-1)/n * X / B + (n-1) * alpha
  ring reduce_scatter(in bytes X)   (n-1)/n * X / B + (n-1) * alpha
  ring all_reduce(X)                2 (n-1)/n * X / B + 2 (n-1) * alpha
  tree all_reduce(X)                2 X / B + 2 log2(n) * alpha   (pipelined binary tree)
  the model takes the faster of ring and tree for all_reduce; all_gather/reduce_scatter: ring.
A dp group that spans slices / nodes runs hierarchically: ring inside the fast domain (k ranks,
bandwidth B_fast) on X, then ring across domains (n/k ranks, B_slow) on X/k. Inside a TPU
torus the latency term is axis by axis: axes * (k^(1/axes) - 1) hops instead of k - 1.

Overlap rule (FSDP2's prefetch): a layer's all_gather is issued one layer ahead and its
reduce_scatter runs while the previous layer's backward computes, so per layer only
max(0, t_fsdp_comm(layer, phase) - t_compute(layer, phase)) is exposed, plus the first
all_gather of the forward and the last reduce_scatter of the backward, which nothing hides.
TP all_reduces sit on the critical path (the next matmul needs their result): fully exposed.
The optimizer step and the loss are ignored (small next to the layers).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

GB = 1e9


@dataclass(frozen=True)
class Model:
    name: str = "Llama-3-8B"
    layers: int = 32
    hidden: int = 4096
    intermediate: int = 14336
    heads: int = 32
    kv_heads: int = 8
    vocab: int = 128256

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def layer_params(self) -> dict:
        h, kvd = self.hidden, self.kv_heads * self.head_dim
        attn = 2 * h * h + 2 * h * kvd          # q, o; k, v (no biases)
        mlp = 3 * h * self.intermediate          # gate, up, down
        norms = 2 * h
        return dict(attn=attn, mlp=mlp, norms=norms, total=attn + mlp + norms)

    def root_params(self) -> int:
        return 2 * self.vocab * self.hidden + self.hidden  # embeddings, lm_head, final norm

    def params(self) -> int:
        return self.layers * self.layer_params()["total"] + self.root_params()

    def matmul_params(self) -> int:
        """Parameters that take part in a matmul per token (all but embeddings and norms)."""
        lp = self.layer_params()
        return self.layers * (lp["attn"] + lp["mlp"]) + self.vocab * self.hidden

    def flops_per_token(self, seq: int) -> float:
        """6 N (forward 2N, backward 4N) + attention 12 * L * hidden * seq (scores and values,
        forward and backward, counted without the causal halving, as PaLM's MFU does)."""
        return 6 * self.matmul_params() + 12 * self.layers * self.hidden * seq


@dataclass(frozen=True)
class Chip:
    name: str
    bf16_tflops: float       # peak dense bf16, TFLOP/s
    hbm_gb: float
    fast_domain: int         # chips sharing the fast interconnect (ICI slice / NVLink node)
    fast_GBps: float         # bytes/s a chip sends on the links a TP ring uses (one axis)
    dp_fast_GBps: float      # bytes/s a chip sends in a dp collective inside the fast domain
    slow_GBps: float         # per chip, between fast domains (DCN / InfiniBand), one direction
    fast_alpha_us: float
    slow_alpha_us: float
    notes: str = ""
    torus_axes: int = 0      # >0: in-domain dp collectives run per torus axis (latency below)


# Published figures (docs/scaling.md cites each one) and the assumptions derived from them.
# TPU ICI: the docs give bidirectional ICI bandwidth per chip; a torus axis ring uses the two
# ports of that axis, both directions: per-chip send bandwidth on one axis = ICI / (2 * axes).
# A dp collective inside the slice is given the other axes: ICI / 2 * (axes - 1) / axes.
def _tpu(name, tflops, hbm, slice_chips, ici_bidir, axes, dcn_gbit, notes):
    return Chip(name, tflops, hbm, slice_chips, ici_bidir / (2 * axes),
                ici_bidir / 2 * (axes - 1) / axes, dcn_gbit / 8, 1.0, 10.0, notes, axes)


CHIPS = {
    "v5p": _tpu("TPU v5p", 459, 95, 6144, 1200, 3, 50,
                "3D torus; largest single slice 6144 chips, beyond: multislice over DCN"),
    "v6e": _tpu("TPU v6e", 918, 32, 256, 800, 2, 100,
                "2D torus, 4 ICI ports; pod (= largest slice) 256 chips, beyond: DCN"),
    "ironwood": _tpu("TPU7x Ironwood", 2307, 192, 9216, 1200, 3, 100,
                     "pod 9216 chips; slice = pod and 3 torus axes ASSUMED"),
    # NVLink 4: 900 GB/s bidirectional per GPU through NVSwitch (any pair at full rate):
    # 450 GB/s send for TP and in-node dp. Between nodes: one 400 Gb/s InfiniBand NIC per GPU
    # (ASSUMED, the usual 8-GPU node with 8 compute NICs).
    "h100": Chip("H100 SXM", 989, 80, 8, 450, 450, 50, 2.0, 5.0,
                 "8-GPU NVLink node; 400 Gb/s IB per GPU between nodes (assumed)"),
    "h200": Chip("H200 SXM", 989, 141, 8, 450, 450, 50, 2.0, 5.0,
                 "as H100 (same GH100 compute), 141 GB HBM3e"),
}


# ---- collectives -------------------------------------------------------------------------

def ring_all_gather(n: int, out_bytes: float, B: float, alpha: float = 0.0) -> float:
    if n <= 1:
        return 0.0
    return (n - 1) / n * out_bytes / B + (n - 1) * alpha


def ring_reduce_scatter(n: int, in_bytes: float, B: float, alpha: float = 0.0) -> float:
    return ring_all_gather(n, in_bytes, B, alpha)


def ring_all_reduce(n: int, nbytes: float, B: float, alpha: float = 0.0) -> float:
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / B + 2 * (n - 1) * alpha


def tree_all_reduce(n: int, nbytes: float, B: float, alpha: float = 0.0) -> float:
    if n <= 1:
        return 0.0
    return 2 * nbytes / B + 2 * math.log2(n) * alpha


def all_reduce(n, nbytes, B, alpha=0.0):
    return min(ring_all_reduce(n, nbytes, B, alpha), tree_all_reduce(n, nbytes, B, alpha))


def torus_hops(n: int, axes: int) -> int:
    """Latency steps of an all_gather over n chips of a torus run axis by axis (a ring per
    axis, n^(1/axes) chips each): axes * (n^(1/axes) - 1), instead of a flat ring's n - 1."""
    if axes <= 0 or n <= 1:
        return n - 1
    return axes * (math.ceil(round(n ** (1 / axes), 9)) - 1)


def hierarchical(kind: str, n: int, k: int, nbytes: float, B_fast, B_slow, a_fast, a_slow,
                 axes: int = 0):
    """all_gather / reduce_scatter over n ranks, k per fast domain: inside, then across.
    Inside a torus (axes > 0) the latency term counts torus_hops instead of n - 1."""
    inner, outer = min(n, k), max(1, n // max(1, min(n, k)))
    f = ring_all_gather if kind == "all_gather" else ring_reduce_scatter
    t_in = f(inner, nbytes, B_fast, 0.0)
    if inner > 1:
        t_in += (torus_hops(inner, axes) if axes else inner - 1) * a_fast
    return t_in + f(outer, nbytes / inner, B_slow, a_slow)


# ---- the per-layer pattern (what collective_census.py counted) ---------------------------

@dataclass(frozen=True)
class Recipe:
    seq: int = 8192
    tp: int = 8                 # capped at the chip count and the fast domain
    seqs_per_replica: int = 0   # 0: tp sequences per dp replica (one sequence's tokens per chip)
    param_bytes: int = 2        # bf16 compute params (MixedPrecisionPolicy param_dtype)
    grad_bytes: int = 4         # fp32 reduce (reduce_dtype)
    act_bytes: int = 2
    mfu: float = 0.5            # ASSUMED fraction of peak bf16 the matmuls reach
    tp_ar_fwd: int = 2          # per layer, counted by the census
    tp_ar_bwd: int = 5


def layer_comm_bytes(m: Model, r: Recipe, tp: int, dp: int, tokens_per_replica: int) -> dict:
    """Per layer per chip: bytes of each collective of the census pattern (one call each)."""
    lp = m.layer_params()
    local = (lp["attn"] + lp["mlp"]) / tp + lp["norms"]   # TP-sharded weights, replicated norms
    act = tokens_per_replica * m.hidden * r.act_bytes     # [b, s, hidden] on every tp rank
    return dict(
        ag_out=local * r.param_bytes,                     # gathered output of one all_gather
        ag_in=local * r.param_bytes / dp,
        rs_in=local * r.grad_bytes,                       # unsharded grads into reduce_scatter
        tp_ar=act,
    )


def root_comm_bytes(m: Model, r: Recipe, dp: int) -> dict:
    root = m.root_params()
    return dict(ag_out=root * r.param_bytes, ag_in=root * r.param_bytes / dp,
                rs_in=root * r.grad_bytes)


@dataclass
class Step:
    chips: int
    tp: int
    dp: int
    tokens: int
    compute_s: float
    tp_s: float
    fsdp_s: float
    fsdp_exposed_s: float
    step_s: float
    tokens_per_s_per_chip: float
    efficiency: float = 0.0
    mem_gb: float = 0.0
    mem_ac_gb: float = 0.0
    bytes_per_step: dict = field(default_factory=dict)


def step(m: Model, chip: Chip, n: int, r: Recipe = Recipe()) -> Step:
    tp = max(1, min(r.tp, n, chip.fast_domain))
    if n % tp:
        raise ValueError(f"{n} chips do not split into tp={tp}")
    dp = n // tp
    seqs = r.seqs_per_replica or tp
    tokens_rep = seqs * r.seq
    L = m.layers
    # compute: per chip its 1/tp share of its replica's tokens
    flops_chip = tokens_rep * m.flops_per_token(r.seq) / tp
    compute = flops_chip / (chip.bf16_tflops * 1e12 * r.mfu)
    per_layer = compute / L                                # the root's share is small: ignored
    fwd_layer, bwd_layer = per_layer / 3, per_layer * 2 / 3
    # TP: ring/tree in the fast domain, on the critical path
    cb = layer_comm_bytes(m, r, tp, dp, tokens_rep)
    B_tp, a_f, a_s = chip.fast_GBps * GB, chip.fast_alpha_us * 1e-6, chip.slow_alpha_us * 1e-6
    t_ar = all_reduce(tp, cb["tp_ar"], B_tp, a_f)
    tp_time = L * (r.tp_ar_fwd + r.tp_ar_bwd) * t_ar
    # FSDP over dp: dp ranks per fast domain = fast_domain / tp
    k = max(1, chip.fast_domain // tp)
    B_dp, B_slow = chip.dp_fast_GBps * GB, chip.slow_GBps * GB

    def ag(x):
        return hierarchical("all_gather", dp, k, x, B_dp, B_slow, a_f, a_s, chip.torus_axes)

    def rs(x):
        return hierarchical("reduce_scatter", dp, k, x, B_dp, B_slow, a_f, a_s,
                            chip.torus_axes)

    t_ag, t_rs = ag(cb["ag_out"]), rs(cb["rs_in"])
    rb = root_comm_bytes(m, r, dp)
    t_root = ag(rb["ag_out"]) + rs(rb["rs_in"])
    fsdp_total = L * (2 * t_ag + t_rs) + t_root
    exposed = (t_ag + t_root                                  # first gathers: nothing to hide
               + (L - 1) * max(0.0, t_ag - fwd_layer)         # forward prefetch
               + L * max(0.0, t_ag + t_rs - bwd_layer)        # backward gather + reduce_scatter
               ) if dp > 1 else 0.0
    total = compute + tp_time + exposed
    # memory per chip: fp32 params + fp32 grads + Adam (8 B) sharded over all chips, the bf16
    # unsharded params of 2 layers in flight, activations (34 * s * b * h / tp bytes per layer
    # with flash attention, no recomputation; full recomputation keeps 2 * s * b * h per layer)
    state = 16 * m.params() / n
    inflight = 2 * cb["ag_out"]
    act = L * 34 * tokens_rep * m.hidden / tp
    act_ac = L * 2 * tokens_rep * m.hidden + 34 * tokens_rep * m.hidden / tp
    bytes_step = dict(
        fsdp_all_gather=L * 2 * cb["ag_out"] + rb["ag_out"],
        fsdp_reduce_scatter=L * cb["rs_in"] + rb["rs_in"],
        tp_all_reduce=L * (r.tp_ar_fwd + r.tp_ar_bwd) * cb["tp_ar"] if tp > 1 else 0,
    )
    return Step(n, tp, dp, dp * tokens_rep, compute, tp_time, fsdp_total, exposed, total,
                dp * tokens_rep / total / n, mem_gb=(state + inflight + act) / GB,
                mem_ac_gb=(state + inflight + act_ac) / GB, bytes_per_step=bytes_step)


def sweep(m: Model, chip: Chip, counts, r: Recipe = Recipe()):
    rows = [step(m, chip, n, r) for n in counts]
    base = rows[0].tokens_per_s_per_chip
    for s in rows:
        s.efficiency = s.tokens_per_s_per_chip / base
    return rows


COUNTS = (1, 8, 64, 512, 4096, 8192)


def table(m: Model, chip: Chip, r: Recipe = Recipe(), counts=COUNTS) -> str:
    out = [f"#### {chip.name}: {chip.bf16_tflops:g} TFLOP/s bf16, {chip.hbm_gb:g} GB HBM; "
           f"TP ring {chip.fast_GBps:g} GB/s, dp in-domain {chip.dp_fast_GBps:g} GB/s, "
           f"fast domain {chip.fast_domain} chips, beyond it {chip.slow_GBps:g} GB/s per chip "
           f"({chip.notes})", "",
           "| chips | tp x dp | tokens/step | compute (s) | TP all_reduce (s) | FSDP comm (s) "
           "| FSDP exposed (s) | step (s) | tokens/s/chip | efficiency | HBM GB (no AC / full AC) |",
           "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for s in sweep(m, chip, counts, r):
        fit = lambda g: f"{g:.0f}" + ("" if g <= chip.hbm_gb else " (over)")
        out.append(f"| {s.chips} | {s.tp} x {s.dp} | {s.tokens:,} | {s.compute_s:.3f} "
                   f"| {s.tp_s:.3f} | {s.fsdp_s:.3f} | {s.fsdp_exposed_s:.3f} | {s.step_s:.3f} "
                   f"| {s.tokens_per_s_per_chip:,.0f} | {s.efficiency:.2f} "
                   f"| {fit(s.mem_gb)} / {fit(s.mem_ac_gb)} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chips", nargs="*", default=list(CHIPS), choices=list(CHIPS))
    ap.add_argument("--tp", type=int, default=Recipe.tp)
    ap.add_argument("--mfu", type=float, default=Recipe.mfu)
    ap.add_argument("--seq", type=int, default=Recipe.seq)
    ap.add_argument("--seqs-per-replica", type=int, default=0,
                    help="sequences per dp replica per step (default: tp)")
    args = ap.parse_args(argv)
    m = Model()
    r = Recipe(seq=args.seq, tp=args.tp, mfu=args.mfu, seqs_per_replica=args.seqs_per_replica)
    lp = m.layer_params()
    print(f"{m.name}: {m.params() / 1e9:.2f} B parameters ({lp['total'] / 1e6:.1f} M per layer, "
          f"root {m.root_params() / 1e6:.0f} M), matmul parameters {m.matmul_params() / 1e9:.2f} B; "
          f"FLOPs per token at seq {r.seq}: {m.flops_per_token(r.seq) / 1e9:.1f} GFLOP "
          f"(6N = {6 * m.matmul_params() / 1e9:.1f}, attention "
          f"{12 * m.layers * m.hidden * r.seq / 1e9:.1f}); MFU {r.mfu}; tp = min({r.tp}, chips, "
          f"fast domain); {r.seqs_per_replica or 'tp'} sequence(s) of {r.seq} per dp replica")
    s8 = step(m, CHIPS["h100"], 64, r)
    print("bytes per chip per step at tp=8, dp=8 (any chip): " + ", ".join(
        f"{k} {v / GB:.2f} GB" for k, v in s8.bytes_per_step.items()))
    for name in args.chips:
        print()
        print(table(m, CHIPS[name], r))


if __name__ == "__main__":
    main()
