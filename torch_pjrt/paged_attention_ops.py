"""Paged attention ops for serving: `tpu::reshape_and_cache` and `tpu::paged_attention`.

Both are lowered in C (csrc/ops/paged_attention.c) as one StableHLO program each; this file
defines their schemas, the Meta kernels that check arguments (with the errors users see) and
give output shapes (so they run in every eager mode and under torch.compile), and CPU kernels
written in plain torch ops (the same semantics, for CPU tensors and for comparison).

Cache layout: a layer's KV cache is one tensor [num_blocks, block_size, num_kv_heads,
2 * head_size] (keys in the first head_size channels, values in the rest); slot = block *
block_size + offset.

- reshape_and_cache(kv_cache, key [T, KVH, D], value [T, KVH, D], slot_mapping [T] int) -> ()
  writes token t's key and value at slot_mapping[t], in place (the cache's buffer is donated
  to the program's result: one row scatter, cost O(T)). Negative slots (padding, vLLM's -1)
  are skipped; so are slots past the cache's end (no error: they are not checked).
- paged_attention(query [T, H, D], kv_cache, context_slots [R, S], query_index [R, Q],
  query_pos [R, Q], output_index [T], scale, soft_cap=0.0, sliding_window=-1) -> [T, H, D]
  with the per-step metadata built once on the host (build_metadata below):
    context_slots[r, k]: cache slot of request r's position k (any valid slot past its end),
    query_index[r, j]:   token (row of `query`) of request r's j-th query row (0 for padding),
    query_pos[r, j]:     that query's position in its request, -1 for a padding row,
    output_index[t]:     row r * Q + j of token t in the [R * Q] grid of query rows; -1 for
                         a token of a request outside the grid (another call's: its output
                         row is 0, or keeps `out`'s value in paged_attention_into).
  Query at position p of request r sees its keys at positions k <= p (and p - k <
  sliding_window when sliding_window > 0); scores in float32, scaled, soft-capped (cap *
  tanh(s / cap)) when soft_cap > 0; GQA/MQA: query head h reads kv head h // (H // KVH).
  Output in query's dtype; padding rows compute 0, never NaN.
- paged_attention_into(out, query, ...same arguments) -> () writes that result into `out`
  (query's shape and dtype; a view is fine) instead of a new tensor.
"""
from __future__ import annotations

import numpy as np
import torch

_LIBS: list = []

_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_INDEX = (torch.int32, torch.int64)


def _check_cache(kv_cache):
    if kv_cache.dim() != 4 or kv_cache.shape[3] % 2 != 0:
        raise ValueError("paged attention: kv_cache must be [num_blocks, block_size, "
                         f"num_kv_heads, 2 * head_size], got shape {tuple(kv_cache.shape)}")
    if kv_cache.dtype not in _FLOATS:
        raise ValueError(f"paged attention: kv_cache must be floating point, got {kv_cache.dtype}")
    return kv_cache.shape[2], kv_cache.shape[3] // 2


def _check_index(name, t, rank):
    if t.dim() != rank:
        raise ValueError(f"paged attention: {name} must have {rank} dims, got shape "
                         f"{tuple(t.shape)}")
    if t.dtype not in _INDEX:
        raise ValueError(f"paged attention: {name} must be int32 or int64, got {t.dtype}")


def _check_reshape_and_cache(kv_cache, key, value, slot_mapping):
    kvh, d = _check_cache(kv_cache)
    _check_index("slot_mapping", slot_mapping, 1)
    t = slot_mapping.shape[0]
    for name, x in (("key", key), ("value", value)):
        if tuple(x.shape) != (t, kvh, d):
            raise ValueError(f"reshape_and_cache: {name} must be [{t}, {kvh}, {d}] (tokens, kv "
                             f"heads, head size), got {tuple(x.shape)}")
        if x.dtype not in _FLOATS:
            raise ValueError(f"reshape_and_cache: {name} must be floating point, got {x.dtype}")


def _check_paged_attention(query, kv_cache, context_slots, query_index, query_pos, output_index):
    kvh, d = _check_cache(kv_cache)
    if query.dim() != 3 or query.shape[2] != d:
        raise ValueError(f"paged_attention: query must be [T, H, {d}], got {tuple(query.shape)}")
    if query.dtype not in _FLOATS:
        raise ValueError(f"paged_attention: query must be floating point, got {query.dtype}")
    if kvh == 0 or query.shape[1] % kvh != 0:
        raise ValueError(f"paged_attention: {query.shape[1]} query heads are not a multiple of "
                         f"{kvh} kv heads")
    _check_index("context_slots", context_slots, 2)
    _check_index("query_index", query_index, 2)
    _check_index("query_pos", query_pos, 2)
    _check_index("output_index", output_index, 1)
    if query_index.shape != query_pos.shape or query_index.shape[0] != context_slots.shape[0]:
        raise ValueError("paged_attention: query_index and query_pos must both be [R, Q] with R "
                         f"= context_slots.shape[0], got {tuple(query_index.shape)}, "
                         f"{tuple(query_pos.shape)}, {tuple(context_slots.shape)}")
    if output_index.shape[0] != query.shape[0]:
        raise ValueError(f"paged_attention: output_index must be [{query.shape[0]}], got "
                         f"{tuple(output_index.shape)}")


def _reshape_and_cache_meta(kv_cache, key, value, slot_mapping):
    _check_reshape_and_cache(kv_cache, key, value, slot_mapping)


def _paged_attention_meta(query, kv_cache, context_slots, query_index, query_pos, output_index,
                          scale, soft_cap=0.0, sliding_window=-1):
    _check_paged_attention(query, kv_cache, context_slots, query_index, query_pos, output_index)
    return query.new_empty(query.shape)


def _check_out(query, out):
    if out.shape != query.shape or out.dtype != query.dtype or out.device != query.device:
        raise ValueError(f"paged_attention: out must be a {query.dtype} tensor of shape "
                         f"{tuple(query.shape)} on {query.device}, got {out.dtype} "
                         f"{tuple(out.shape)} on {out.device}")


def _paged_attention_into_meta(out, query, kv_cache, context_slots, query_index, query_pos,
                               output_index, scale, soft_cap=0.0, sliding_window=-1):
    _check_paged_attention(query, kv_cache, context_slots, query_index, query_pos, output_index)
    _check_out(query, out)


def _check_in_range(index, size: int) -> None:
    """CPU's IndexError for the first element of `index` outside [0, size) (the tpu lowering
    reports the same through its device-side index checks)."""
    bad = (index < 0) | (index >= size)
    if bool(bad.any()):
        raise IndexError(f"index {int(index[bad][0])} is out of bounds for dimension 0 with "
                         f"size {size}")


def _reshape_and_cache_cpu(kv_cache, key, value, slot_mapping):
    _check_reshape_and_cache(kv_cache, key, value, slot_mapping)
    kvh, d = kv_cache.shape[2], kv_cache.shape[3] // 2
    rows = kv_cache.view(-1, kvh, 2 * d)
    keep = slot_mapping >= 0  # negative slots: padding tokens
    _check_in_range(slot_mapping[keep], rows.shape[0])
    idx = slot_mapping[keep].long()
    rows[idx] = torch.cat([key[keep], value[keep]], dim=-1).to(rows.dtype)


def _paged_attention_cpu(query, kv_cache, context_slots, query_index, query_pos, output_index,
                         scale, soft_cap=0.0, sliding_window=-1):
    _check_paged_attention(query, kv_cache, context_slots, query_index, query_pos, output_index)
    T, H, D = query.shape
    kvh = kv_cache.shape[2]
    R, S = context_slots.shape
    if T == 0 or R == 0 or S == 0 or kv_cache.numel() == 0:
        return query.new_zeros(query.shape)
    Q = query_index.shape[1]
    rows = kv_cache.reshape(-1, kvh, 2 * D)
    _check_in_range(context_slots, rows.shape[0])
    _check_in_range(query_index, T)
    _check_in_range(output_index[output_index >= 0], R * Q)  # -1: another grid's token
    ctx = rows[context_slots.long()].float()  # [R, S, KVH, 2D]
    pos = query_pos.long()
    reach = torch.arange(S).view(1, S) <= pos.max(dim=1).values.view(R, 1)
    keys = ctx[..., :D]
    vals = ctx[..., D:].masked_fill(~reach.view(R, S, 1, 1), 0.0)
    q = query[query_index.long()].float().view(R, Q, kvh, H // kvh, D)
    s = torch.einsum("rqkgd,rskd->rkqgs", q, keys) * scale
    if soft_cap > 0:
        s = torch.tanh(s / soft_cap) * soft_cap
    k = torch.arange(S).view(1, 1, S)
    seen = (k <= pos.unsqueeze(-1)) & (pos.unsqueeze(-1) >= 0)
    if sliding_window > 0:
        seen &= (pos.unsqueeze(-1) - k) < sliding_window
    s = s.masked_fill(~seen.view(R, 1, Q, 1, S), float("-inf"))
    mx = s.amax(dim=-1, keepdim=True)
    mx = torch.where(mx == float("-inf"), torch.zeros_like(mx), mx)
    e = torch.exp(s - mx)
    den = e.sum(dim=-1, keepdim=True)
    den = torch.where(den == 0, torch.ones_like(den), den)
    o = torch.einsum("rkqgs,rskd->rkqgd", e, vals) / den
    o = o.permute(0, 2, 1, 3, 4).reshape(R * Q, H, D)
    idx = output_index.long()
    rows = o[idx.clamp_min(0)]
    return rows.masked_fill((idx < 0).view(-1, 1, 1), 0.0).to(query.dtype)


def _paged_attention_into_cpu(out, query, kv_cache, context_slots, query_index, query_pos,
                              output_index, scale, soft_cap=0.0, sliding_window=-1):
    _check_out(query, out)
    res = _paged_attention_cpu(query, kv_cache, context_slots, query_index, query_pos,
                               output_index, scale, soft_cap, sliding_window)
    mine = (output_index >= 0).view(-1, 1, 1)
    out.copy_(torch.where(mine, res, out))


def _bucket(n: int) -> int:
    """n rounded up to a power of two (at least 1): grid sizes that vary step by step take few
    distinct values, so few distinct programs are compiled."""
    return 1 << max(int(n) - 1, 0).bit_length()


def query_metadata(query_start_loc, seq_lens, block_size: int, requests=None):
    """The host-side part of paged_attention's per-step metadata (numpy int64), from each
    request's first token in the batch (query_start_loc [R + 1], cumulative query lengths) and
    its context length after the step (seq_lens [R]; its new tokens are its last positions).
    `requests` (indices, default all) picks the requests of this grid; the tokens of the
    others get output_index -1.

    Returns (query_index [R', Q], query_pos [R', Q], output_index [T], S): R' is the number of
    requests and Q their longest query, both rounded up to a power of two, S their longest
    context rounded up to a multiple of block_size (extra rows are padding, query_pos -1; extra
    context positions are past every query, so masked). Rounding keeps the number of distinct
    program shapes small while contexts grow by one token per decode step."""
    qsl_all = np.asarray(query_start_loc, dtype=np.int64)
    seq_all = np.asarray(seq_lens, dtype=np.int64)
    T = int(qsl_all[-1]) if len(qsl_all) > 1 else 0
    sel = (np.arange(len(seq_all)) if requests is None
           else np.asarray(requests, dtype=np.int64).reshape(-1))
    starts, seq = qsl_all[:-1][sel], seq_all[sel]
    q_lens = (qsl_all[1:] - qsl_all[:-1])[sel]
    R = len(seq)
    Q = _bucket(int(q_lens.max()) if R else 1)
    Rp = _bucket(R)
    S = max(-(-int(seq.max() if R else 1) // block_size), 1) * block_size
    rows = np.arange(Q)
    valid = np.zeros((Rp, Q), dtype=bool)
    valid[:R] = rows[None, :] < q_lens[:, None]
    query_index = np.zeros((Rp, Q), np.int64)
    query_pos = np.full((Rp, Q), -1, np.int64)
    query_index[:R] = starts[:, None] + rows[None, :]
    query_pos[:R] = (seq - q_lens)[:, None] + rows[None, :]
    query_index[~valid] = 0
    query_pos[~valid] = -1
    tok = np.arange(T)
    req = np.searchsorted(qsl_all[1:], tok, side="right")  # each token's request
    grid_row = np.full(len(seq_all), -1, np.int64)
    grid_row[sel] = np.arange(R)
    row = grid_row[req]
    output_index = np.where(row >= 0, row * Q + (tok - qsl_all[req]), -1)
    return query_index, query_pos, output_index, S


def split_requests(q_lens) -> list:
    """The requests of each grid (paged_attention call) of a step, from its query lengths:
    [None] (all in one grid), or [decodes, the rest] (index arrays) when one grid as wide as
    the longest query would have at least twice the rows of the two (a long prefill chunk
    would otherwise pad every decode of its step to its length)."""
    q_lens = np.asarray(q_lens, dtype=np.int64)
    decodes, rest = np.nonzero(q_lens == 1)[0], np.nonzero(q_lens != 1)[0]
    if len(decodes) == 0 or len(rest) == 0:
        return [None]
    one = _bucket(len(q_lens)) * _bucket(int(q_lens.max()))
    two = _bucket(len(decodes)) + _bucket(len(rest)) * _bucket(int(q_lens[rest].max()))
    return [decodes, rest] if 2 * two <= one else [None]


def context_slots(block_table, num_requests: int, num_positions: int, block_size: int):
    """Cache slot of positions 0..num_positions-1 of each request (rows past the block table's
    requests: block 0, read by padding rows only), from block_table [>= R, >= blocks] (a numpy
    array or a tensor on any device; the result is of the same kind)."""
    nblk = -(-num_positions // block_size)
    if isinstance(block_table, np.ndarray):
        k = np.arange(num_positions)
        bt = np.zeros((num_requests, nblk), np.int64)
        n = min(num_requests, block_table.shape[0])
        bt[:n] = block_table[:n, :nblk]
        return bt[:, k // block_size] * block_size + k % block_size
    k = torch.arange(num_positions, dtype=torch.int64)
    n = min(num_requests, block_table.shape[0])
    bt = block_table[:n, :nblk].to(torch.int64)
    if n < num_requests:
        bt = torch.cat([bt, bt.new_zeros(num_requests - n, nblk)])
    dev = block_table.device
    return bt[:, (k // block_size).to(dev)] * block_size + (k % block_size).to(dev)


def build_metadata(query_start_loc, seq_lens, block_table, block_size: int, requests=None):
    """All of paged_attention's metadata on the host (numpy int64): (context_slots [R', S],
    query_index [R', Q], query_pos [R', Q], output_index [T], slot_mapping [T]) for a block
    table [R, >= ceil(max(seq_lens) / block_size)] (query_metadata: shapes, padding and
    `requests`); slot_mapping covers every token of the step."""
    qi, qp, oi, S = query_metadata(query_start_loc, seq_lens, block_size, requests)
    bt = np.asarray(block_table, dtype=np.int64)
    sel = np.arange(len(bt)) if requests is None else np.asarray(requests, dtype=np.int64)
    cs = context_slots(bt[sel], qi.shape[0], S, block_size)
    return cs, qi, qp, oi, slot_mapping(query_start_loc, seq_lens, bt, block_size)


def slot_mapping(query_start_loc, seq_lens, block_table, block_size: int) -> np.ndarray:
    """The cache slot of every token of the step (numpy int64 [T]): token t of request r, at
    position p (its request's new tokens are the last of its seq_lens[r] positions), goes to
    block_table[r, p // block_size] * block_size + p % block_size."""
    qsl = np.asarray(query_start_loc, dtype=np.int64)
    seq = np.asarray(seq_lens, dtype=np.int64)
    tok = np.arange(int(qsl[-1]))
    req = np.searchsorted(qsl[1:], tok, side="right")
    pos = seq[req] - (qsl[req + 1] - qsl[req]) + (tok - qsl[req])
    bt = np.asarray(block_table)
    return bt[req, pos // block_size].astype(np.int64) * block_size + pos % block_size


def register() -> None:
    """Defines the ops and registers their Meta and CPU kernels once per process (the tpu
    kernels are the C lowerings, reached through the device's boxed dispatcher)."""
    if _LIBS:
        return
    lib = torch.library.Library("tpu", "FRAGMENT")
    lib.define("reshape_and_cache(Tensor(a!) kv_cache, Tensor key, Tensor value, "
               "Tensor slot_mapping) -> ()")
    lib.define("paged_attention(Tensor query, Tensor kv_cache, Tensor context_slots, "
               "Tensor query_index, Tensor query_pos, Tensor output_index, float scale, "
               "float soft_cap=0.0, int sliding_window=-1) -> Tensor")
    # The result written into an existing [T, H, D] tensor of query's dtype (a view of vLLM's
    # output buffer), saving the copy a separate result would need. Returns nothing: a custom
    # op returning an alias of an argument cannot be functionalized (torch.compile).
    lib.define("paged_attention_into(Tensor(a!) out, Tensor query, Tensor kv_cache, "
               "Tensor context_slots, Tensor query_index, Tensor query_pos, "
               "Tensor output_index, float scale, float soft_cap=0.0, "
               "int sliding_window=-1) -> ()")
    lib.impl("reshape_and_cache", _reshape_and_cache_meta, "Meta")
    lib.impl("paged_attention", _paged_attention_meta, "Meta")
    lib.impl("reshape_and_cache", _reshape_and_cache_cpu, "CPU")
    lib.impl("paged_attention", _paged_attention_cpu, "CPU")
    lib.impl("paged_attention_into", _paged_attention_into_meta, "Meta")
    lib.impl("paged_attention_into", _paged_attention_into_cpu, "CPU")
    _LIBS.append(lib)
