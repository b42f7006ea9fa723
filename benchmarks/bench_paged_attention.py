"""Per-layer attention time of vLLM's tpu attention: the fused ops (tpu::reshape_and_cache +
tpu::paged_attention, csrc/ops/paged_attention.c) against the plain-torch formula that
torch_pjrt/serving/vllm/attention.py ran before them (kept here only, as `old_layer`).

One layer's call as forward() makes it: write the step's new keys/values into the paged cache,
attend, copy into the output buffer; then torch.tpu.synchronize(). Three steps:
  decode:  8 requests, one new token each, context 256 each;
  prefill: one request, 128 new tokens, context 128;
  mixed:   those 8 decodes and a 128-token prefill chunk (positions 128..255) in one step,
           which attention.py runs as two grids (paged_attention_ops.split_requests); its
           extra row compares with the same step as one grid (columns: one grid, two).
Cache [blocks, 16, KVH, 2*D] with the requests' blocks scattered through it. Strict mode; the
two versions' repetitions alternate (other load falls on both); median of --reps. Also the
cache write alone at two cache sizes (it should cost the same: O(T), not O(cache); a clone of
the cache shows what one pass over it costs), the decode layer as one DeferAndFuse program
(write and attention fused: it should cost what Strict mode's two programs do, not passes
over the cache), and the programs run per layer call (torch.tpu.metrics()'s executions).

    .venv/bin/python benchmarks/bench_paged_attention.py [--reps 50] [--heads 16 --kv-heads 4
        --head-size 64] [--dtype float32] [--out docs/serving-paged-attention.md]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from markdown_section import write_section  # noqa: E402

import torch_pjrt  # noqa: E402,F401
from torch_pjrt import paged_attention_ops as pa  # noqa: E402

BEGIN = "<!-- bench_paged_attention: begin -->"
END = "<!-- bench_paged_attention: end -->"
TPU = torch.device("tpu")
BS = 16


def old_metadata(qsl, seq_lens, block_table):
    """The previous builder's metadata: context slots, padded query rows, an [R, Q, S] mask."""
    R = len(seq_lens)
    q_lens = qsl[1:] - qsl[:-1]
    Q, S = int(q_lens.max()), int(seq_lens.max())
    rows = np.arange(Q)
    valid_q = rows[None, :] < q_lens[:, None]
    query_index = np.where(valid_q, qsl[:-1, None] + rows[None, :], 0)
    q_pos = (seq_lens - q_lens)[:, None] + rows[None, :]
    mask = np.arange(S)[None, None, :] <= q_pos[:, :, None]
    mask[~valid_q] = False
    mask[..., 0] |= ~valid_q
    tok = np.arange(int(qsl[-1]))
    tok_req = np.searchsorted(qsl[1:], tok, side="right")
    output_index = tok_req * Q + (tok - qsl[tok_req])
    k = np.arange(S)
    cs = block_table[:R, k // BS] * BS + k % BS
    return [torch.from_numpy(a).to(TPU) for a in (cs, query_index, mask, output_index)]


def old_layer(query, key, value, kv_cache, slot_mapping, md, output, H, Hkv, D, scale):
    """The plain-torch attention of the previous attention.py (kv_cache: logical view)."""
    cs, query_index, mask, output_index = md
    T = query.shape[0]
    group = H // Hkv
    flat = kv_cache.transpose(1, 2).view(-1, Hkv, 2 * D)
    flat[slot_mapping] = torch.cat([key.view(T, Hkv, D), value.view(T, Hkv, D)], dim=-1)
    R, S = cs.shape
    Qr = query_index.shape[1]
    ctx = flat[cs]
    keys = ctx[..., :D].unsqueeze(3).expand(R, S, Hkv, group, D).reshape(R, S, H, D)
    vals = ctx[..., D:].unsqueeze(3).expand(R, S, Hkv, group, D).reshape(R, S, H, D)
    q = query.view(T, H, D)[query_index]
    scores = torch.einsum("rqhd,rshd->rhqs", q.float(), keys.float()) * scale
    scores = scores.masked_fill(~mask.unsqueeze(1), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("rhqs,rshd->rqhd", probs, vals.float()).reshape(R * Qr, H, D)
    output.view(T, H, D).copy_(out[output_index].to(output.dtype))


def new_layer(query, key, value, kv_cache, slot_mapping, grids, output, H, Hkv, D, scale):
    """What attention.py's forward() runs now (grids: one or two metadata sets)."""
    T = query.shape[0]
    cache = kv_cache.transpose(1, 2)
    torch.ops.tpu.reshape_and_cache(cache, key.view(T, Hkv, D), value.view(T, Hkv, D),
                                    slot_mapping)
    for cs, qi, qp, oi in grids:
        torch.ops.tpu.paged_attention_into(output.view(T, H, D), query.view(T, H, D), cache,
                                           cs, qi, qp, oi, scale)


def make_step(reqs, nblocks, H, Hkv, D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    need = [-(-L // BS) for L, _ in reqs]
    perm = torch.randperm(nblocks, generator=g)[: sum(need)].tolist()
    bt = np.zeros((len(reqs), max(need)), np.int64)
    i = 0
    for r, n in enumerate(need):
        bt[r, :n] = perm[i:i + n]
        i += n
    qsl = np.cumsum([0] + [n for _, n in reqs])
    seq = np.array([L for L, _ in reqs])
    T = int(qsl[-1])
    phys = torch.randn(nblocks, BS, Hkv, 2 * D, generator=g).to(dtype).to(TPU)
    sm = pa.build_metadata(qsl, seq, bt, BS)[4]

    def grids(split):
        sels = pa.split_requests(qsl[1:] - qsl[:-1]) if split else [None]
        return [[torch.from_numpy(a).to(TPU) for a in pa.build_metadata(qsl, seq, bt, BS, g)[:4]]
                for g in sels]
    return dict(
        cache=phys.permute(0, 2, 1, 3),  # the logical view vLLM hands to forward()
        query=torch.randn(T, H * D, generator=g).to(dtype).to(TPU),
        key=torch.randn(T, Hkv * D, generator=g).to(dtype).to(TPU),
        value=torch.randn(T, Hkv * D, generator=g).to(dtype).to(TPU),
        slots=torch.from_numpy(sm).to(TPU),
        old_md=old_metadata(qsl, seq, bt),
        one_grid=grids(False),
        new_md=grids(True),  # what attention.py runs: split where split_requests says
        out_old=torch.empty(T, H * D, dtype=dtype, device=TPU),
        out_new=torch.empty(T, H * D, dtype=dtype, device=TPU),
    )


def _executions(fn) -> int:
    torch.tpu.synchronize()
    before = torch.tpu.metrics()["executions"]
    fn()
    torch.tpu.synchronize()
    return int(torch.tpu.metrics()["executions"] - before)


def _time_pair(fa, fb, reps):
    for _ in range(3):
        fa(), fb()
    ta, tb = [], []
    for _ in range(reps):
        for fn, ts in ((fa, ta), (fb, tb)):
            t0 = time.perf_counter()
            fn()
            torch.tpu.synchronize()
            ts.append(time.perf_counter() - t0)
    return statistics.median(ta) * 1e3, statistics.median(tb) * 1e3


def run(args):
    H, Hkv, D = args.heads, args.kv_heads, args.head_size
    dtype = getattr(torch, args.dtype)
    scale = D ** -0.5
    rows, split_rows = [], []
    for name, reqs in (("decode: 8 requests x context 256", [(256, 1)] * 8),
                       ("prefill: 128 tokens", [(128, 128)]),
                       ("mixed: those 8 decodes + a 128-token chunk at 128..255",
                        [(256, 1)] * 4 + [(256, 128)] + [(256, 1)] * 4)):
        st = make_step(reqs, args.blocks, H, Hkv, D, dtype)

        def old():
            old_layer(st["query"], st["key"], st["value"], st["cache"], st["slots"],
                      st["old_md"], st["out_old"], H, Hkv, D, scale)

        def new():
            new_layer(st["query"], st["key"], st["value"], st["cache"], st["slots"],
                      st["new_md"], st["out_new"], H, Hkv, D, scale)

        t_old, t_new = _time_pair(old, new, args.reps)
        n_old, n_new = _executions(old), _executions(new)
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(st["out_new"].cpu(), st["out_old"].cpu(), rtol=tol, atol=tol)
        rows.append((name, t_old, t_new, n_old, n_new))
        if len(st["new_md"]) > 1:  # the same step as one grid, for comparison

            def one():
                new_layer(st["query"], st["key"], st["value"], st["cache"], st["slots"],
                          st["one_grid"], st["out_new"], H, Hkv, D, scale)

            t_one, t_two = _time_pair(one, new, args.reps)
            split_rows.append((name, t_one, t_two))

    # the cache write alone: O(T) whatever the cache size
    write_rows = []
    project = torch.compile(lambda a: a * 1.0, backend="tpu")
    consume = torch.compile(lambda o: o.sum(), backend="tpu")
    for nblocks in (args.blocks, args.blocks * 16):
        st = make_step([(256, 1)] * 8, nblocks, H, Hkv, D, dtype)
        cache = st["cache"].transpose(1, 2)
        k, v = st["key"].view(-1, Hkv, D), st["value"].view(-1, Hkv, D)

        def write():  # then one element read back: the write has run
            torch.ops.tpu.reshape_and_cache(cache, k, v, st["slots"])
            cache[0, 0, 0, 0].item()

        def clone():  # for scale: one pass over the whole cache
            cache.clone()[0, 0, 0, 0].item()

        # one decode token: XLA turns its one-row scatter into a dynamic-update-slice
        s1 = make_step([(256, 1)], nblocks, H, Hkv, D, dtype)
        qkv = torch.cat([s1["query"], s1["key"], s1["value"]], dim=1)
        nq, nk = s1["query"].shape[1], s1["key"].shape[1]

        def layer(mode):
            """The decode layer between two compiled pieces, as in vLLM's step: q, k and v
            are slices of a compiled projection's output, the attention output feeds the next
            compiled piece; the layer call (write, then attention) runs in `mode`."""
            x = project(qkv)
            out = torch.empty_like(s1["out_new"])
            with torch.tpu.eager_mode(mode):
                new_layer(x[:, :nq], x[:, nq:nq + nk], x[:, nq + nk:], s1["cache"],
                          s1["slots"], s1["new_md"], out, H, Hkv, D, scale)
            consume(out).item()

        # not interleaved: a clone's 100s of MB in between would evict what the write touches
        t, _ = _time_pair(write, write, args.reps)
        t_clone, _ = _time_pair(clone, clone, max(args.reps // 8, 3))
        # DeferAndFuse records the layer as one program that writes the cache and reads it
        t_strict, t_fused = _time_pair(lambda: layer("strict"), lambda: layer("defer_and_fuse"),
                                       args.reps)
        mb = cache.numel() * cache.element_size() / 2**20
        write_rows.append((nblocks, mb, t, t_clone, t_strict, t_fused))
    return rows, split_rows, write_rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-size", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=256)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows, split_rows, write_rows = run(args)
    threads = (f"torch threads {torch.get_num_threads()}, "
               f"{len(os.sched_getaffinity(0))} usable cores (os.sched_getaffinity)")
    lines = [BEGIN,
             f"Per-layer attention, {args.dtype}, {args.heads} query heads / {args.kv_heads} kv "
             f"heads, head size {args.head_size}, cache {args.blocks} blocks x {BS}; strict "
             f"mode; median of {args.reps}; {threads}.",
             "",
             "| step | plain torch (ms) | fused ops (ms) | speedup | programs/layer old | new |",
             "|---|---|---|---|---|---|"]
    for name, t_old, t_new, n_old, n_new in rows:
        lines.append(f"| {name} | {t_old:.3f} | {t_new:.3f} | {t_old / t_new:.2f}x | "
                     f"{n_old} | {n_new} |")
    lines += ["", "The mixed step as attention.py runs it (decodes and the chunk as two grids, "
              "two paged_attention_into calls) against one grid (every decode padded to the "
              "chunk's 128 query rows):", "",
              "| step | one grid (ms) | two grids (ms) |", "|---|---|---|"]
    for name, t_one, t_two in split_rows:
        lines.append(f"| {name} | {t_one:.3f} | {t_two:.3f} |")
    lines += ["", "reshape_and_cache alone (8 tokens, then one cache element read back), against "
              "a clone of the cache (one pass over it); and a one-token decode layer call (write, "
              "then attention) between two compiled pieces, in Strict mode (two programs) and in "
              "DeferAndFuse (one program that writes the cache and reads it):", "",
              "| cache blocks | cache MB | write (ms) | clone (ms) | 1-token layer, Strict (ms) | "
              "same, DeferAndFuse (ms) |", "|---|---|---|---|---|---|"]
    for nb, mb, t, tc, ts, tf in write_rows:
        lines.append(f"| {nb} | {mb:.0f} | {t:.3f} | {tc:.3f} | {ts:.3f} | {tf:.3f} |")
    lines += ["", "Command: `" + " ".join(["benchmarks/bench_paged_attention.py"] + sys.argv[1:])
              + "`", END]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_section(args.out, BEGIN, END, text)


if __name__ == "__main__":
    main()
