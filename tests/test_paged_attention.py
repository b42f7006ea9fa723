"""tpu::reshape_and_cache and tpu::paged_attention (csrc/ops/paged_attention.c) against a
plain-torch reference on CPU written here request by request (no vLLM needed).

A step is a list of requests (context length after the step, new tokens in the step): the
keys/values of earlier positions are written straight into the cache, the new ones through
reshape_and_cache, and slots no request uses hold NaN, so a read of one would show."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from conftest import TPU, delta, metrics
from torch_pjrt import paged_attention_ops as pa

BS = 4  # block size
D = 8  # head size

STEPS = {
    "decode": [(5, 1), (9, 1), (1, 1)],
    "prefill": [(6, 6), (3, 3)],
    # a chunked prefill (second chunk: 4 new tokens after 5 cached), a prefill and decodes
    "mixed": [(9, 4), (7, 1), (3, 3), (12, 1)],
}


def _step(reqs, heads, kvh, dtype, seed, pad_tokens=0):
    """Everything one step needs: cache (NaN where unused), new keys/values, queries, the
    metadata (host-built by paged_attention_ops.build_metadata) and each request's full keys,
    values and queries for the reference."""
    g = torch.Generator().manual_seed(seed)
    nblocks_req = [-(-L // BS) for L, _ in reqs]
    nb = sum(nblocks_req) + 3
    perm = torch.randperm(nb, generator=g).tolist()  # blocks scattered through the cache
    bt = np.zeros((len(reqs), max(nblocks_req)), np.int64)
    used = 0
    for r, n in enumerate(nblocks_req):
        bt[r, :n] = perm[used:used + n]
        used += n
    cache = torch.full((nb, BS, kvh, 2 * D), float("nan"), dtype=dtype)
    flat = cache.view(-1, kvh, 2 * D)
    full_k, full_v, qs, new_k, new_v, new_q = [], [], [], [], [], []
    for r, (L, n) in enumerate(reqs):
        k = torch.randn(L, kvh, D, generator=g).to(dtype)
        v = torch.randn(L, kvh, D, generator=g).to(dtype)
        q = torch.randn(n, heads, D, generator=g).to(dtype)
        slots = torch.tensor([bt[r, p // BS] * BS + p % BS for p in range(L - n)], dtype=torch.long)
        flat[slots] = torch.cat([k[: L - n], v[: L - n]], dim=-1)
        full_k.append(k), full_v.append(v), qs.append(q)
        new_k.append(k[L - n:]), new_v.append(v[L - n:]), new_q.append(q)
    qsl = np.cumsum([0] + [n for _, n in reqs])
    cs, qi, qp, oi, sm = pa.build_metadata(qsl, [L for L, _ in reqs], bt, BS)
    key, value, query = torch.cat(new_k), torch.cat(new_v), torch.cat(new_q)
    slot_mapping = torch.from_numpy(sm)
    if pad_tokens:  # vLLM pads the batch with tokens whose slot is -1
        key = torch.cat([key, torch.randn(pad_tokens, kvh, D, generator=g).to(dtype)])
        value = torch.cat([value, torch.randn(pad_tokens, kvh, D, generator=g).to(dtype)])
        slot_mapping = torch.cat([slot_mapping, torch.full((pad_tokens,), -1)])
    meta = [torch.from_numpy(a) for a in (cs, qi, qp, oi)]
    return dict(cache=cache, key=key, value=value, query=query, slot_mapping=slot_mapping,
                meta=meta, full=(full_k, full_v, qs), reqs=reqs, block_table=bt)


def _reference(st, scale, soft_cap=0.0, window=-1):
    """softmax(Q K^T * scale) V per request in float32, causal (and windowed), the kv head of
    query head h being h // (H // KVH); tokens in batch order."""
    outs = []
    for (L, n), k, v, q in zip(st["reqs"], *st["full"]):
        group = q.shape[1] // k.shape[1]
        kk = k.float().repeat_interleave(group, dim=1)  # [L, H, D]
        vv = v.float().repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->hqk", q.float(), kk) * scale
        if soft_cap > 0:
            s = soft_cap * torch.tanh(s / soft_cap)
        qpos = torch.arange(L - n, L).view(n, 1)
        kpos = torch.arange(L).view(1, L)
        seen = kpos <= qpos
        if window > 0:
            seen &= qpos - kpos < window
        s = s.masked_fill(~seen, float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), vv))
    return torch.cat(outs).to(st["query"].dtype)


def _run(st, scale, device, soft_cap=0.0, window=-1):
    cache = st["cache"].to(device)
    t = st["query"].shape[0]
    torch.ops.tpu.reshape_and_cache(cache, st["key"].to(device), st["value"].to(device),
                                    st["slot_mapping"].to(device))
    out = torch.ops.tpu.paged_attention(st["query"].to(device), cache,
                                        *(m.to(device) for m in st["meta"]), scale,
                                        soft_cap, window)
    assert out.shape == (t, st["query"].shape[1], D) and out.dtype == st["query"].dtype
    return out.cpu(), cache.cpu()


TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kvh", [(4, 2), (4, 1)])
@pytest.mark.parametrize("kind", sorted(STEPS))
def test_matches_reference(kind, heads, kvh, dtype):
    st = _step(STEPS[kind], heads, kvh, dtype, seed=len(kind) + heads * 10 + kvh)
    out, _ = _run(st, 0.35, TPU)
    assert torch.isfinite(out.float()).all()
    torch.testing.assert_close(out, _reference(st, 0.35), **TOL[dtype])
    cpu_out, _ = _run(st, 0.35, "cpu")  # the CPU kernel: the same op on CPU tensors
    torch.testing.assert_close(out, cpu_out, **TOL[dtype])


@pytest.mark.parametrize("soft_cap,window,dtype", [(0.0, 3, torch.float32),
                                                   (2.0, -1, torch.bfloat16),
                                                   (1.5, 4, torch.float32)])
def test_sliding_window_and_soft_cap(soft_cap, window, dtype):
    st = _step(STEPS["mixed"], 4, 2, dtype, seed=7)
    out, _ = _run(st, 0.5, TPU, soft_cap, window)
    ref = _reference(st, 0.5, soft_cap, window)
    torch.testing.assert_close(out, ref, **TOL[dtype])
    # the options change the result (a test that could not fail otherwise)
    assert (out.float() - _reference(st, 0.5).float()).abs().max() > 1e-2


def test_padding_rows_and_tokens_no_nan():
    # one long prefill pads every decode request to 6 query rows; 3 padding tokens (slot -1)
    st = _step([(6, 6), (4, 1), (8, 1)], 4, 2, torch.float32, seed=3, pad_tokens=3)
    before = st["cache"].clone()
    out, cache = _run(st, 0.3, TPU)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, _reference(st, 0.3), rtol=1e-5, atol=1e-5)
    # padding tokens wrote nothing: every slot not in slot_mapping is unchanged (NaN included)
    written = st["slot_mapping"][st["slot_mapping"] >= 0]
    untouched = torch.ones(cache.shape[0] * BS, dtype=torch.bool)
    untouched[written] = False
    a = cache.view(-1, 2, 2 * D)[untouched]
    b = before.view(-1, 2, 2 * D)[untouched]
    assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def _cpu_cache_after(st):
    cache = st["cache"].clone()
    torch.ops.tpu.reshape_and_cache(cache, st["key"], st["value"], st["slot_mapping"])
    return cache


def _same(a, b):
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def test_cache_write_in_place_in_each_mode(mode):
    st = _step(STEPS["mixed"], 4, 2, torch.bfloat16, seed=11, pad_tokens=2)
    expect = _cpu_cache_after(st)
    # the CPU result itself: the new rows at their slots, the rest as before
    flat = expect.view(-1, 2, 2 * D)
    keep = st["slot_mapping"] >= 0
    assert torch.equal(flat[st["slot_mapping"][keep]],
                       torch.cat([st["key"], st["value"]], dim=-1)[keep])
    cache = st["cache"].to(TPU)
    view = cache.view(-1)  # an alias sees the write
    ptr = cache.data_ptr()
    torch.ops.tpu.reshape_and_cache(cache, st["key"].to(TPU), st["value"].to(TPU),
                                    st["slot_mapping"].to(TPU).to(torch.int32))
    assert cache.data_ptr() == ptr
    assert _same(cache.cpu(), expect)
    assert _same(view.cpu(), expect.view(-1))


def test_out_form_writes_into_a_view(mode):
    st = _step(STEPS["mixed"], 4, 1, torch.bfloat16, seed=9)
    t = st["query"].shape[0]
    expect, _ = _run(st, 0.3, TPU)
    cache = st["cache"].to(TPU)
    torch.ops.tpu.reshape_and_cache(cache, st["key"].to(TPU), st["value"].to(TPU),
                                    st["slot_mapping"].to(TPU))
    buf = torch.full((t + 3, 4 * D), 7.0, dtype=torch.bfloat16, device=TPU)  # padded rows too
    ptr = buf.data_ptr()
    torch.ops.tpu.paged_attention_into(buf[:t].view(t, 4, D), st["query"].to(TPU), cache,
                                       *(m.to(TPU) for m in st["meta"]), 0.3)
    assert buf.data_ptr() == ptr
    got = buf.cpu()
    assert torch.equal(got[:t].view(t, 4, D), expect)
    assert torch.equal(got[t:], torch.full((3, 4 * D), 7.0, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="out must be"):
        torch.ops.tpu.paged_attention_into(buf[:t].view(t, 4, D).float(), st["query"].to(TPU),
                                           cache, *(m.to(TPU) for m in st["meta"]), 0.3)


def test_fused_in_defer_mode_and_compiled():
    st = _step(STEPS["mixed"], 4, 2, torch.float32, seed=5, pad_tokens=1)
    ref_out, ref_cache = _run(st, 0.4, TPU, 1.0, 6)  # strict
    t = ref_out.shape[0]

    def step(cache, buf, q, k, v, slots, cs, qi, qp, oi):
        torch.ops.tpu.reshape_and_cache(cache, k, v, slots)
        torch.ops.tpu.paged_attention_into(buf[:t].view(t, 4, D), q, cache, cs, qi, qp, oi,
                                           0.4, 1.0, 6)
        return torch.ops.tpu.paged_attention(q, cache, cs, qi, qp, oi, 0.4, 1.0, 6)

    args = [st["query"], st["key"], st["value"], st["slot_mapping"], *st["meta"]]
    args = [a.to(TPU) for a in args]

    def check(fn, what):
        cache = st["cache"].to(TPU)
        buf = torch.zeros(t + 2, 4 * D, device=TPU)
        torch.tpu.synchronize()
        before = metrics()
        out = fn(cache, buf, *args)
        torch.tpu.synchronize()
        d = delta(before, metrics())
        # everything in one program (and a trim of buf, which zeros padded: bucket.h)
        assert d.get("executions") - d.get("bucket_trims", 0) == 1, (what, d)
        torch.testing.assert_close(out.cpu(), ref_out, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(buf[:t].view(t, 4, D).cpu(), ref_out, rtol=1e-6, atol=1e-6)
        assert torch.equal(buf[t:].cpu(), torch.zeros(2, 4 * D))
        assert _same(cache.cpu(), ref_cache)
        return d

    torch.tpu.set_eager_mode("defer_and_fuse")
    try:
        d = check(step, "defer_and_fuse")
    finally:
        torch.tpu.set_eager_mode("strict")
    assert d.get("defer_ops", 0) >= 3, d

    compiled = torch.compile(step, backend="tpu", fullgraph=True)
    for _ in range(2):
        d = check(compiled, "compiled")
        assert d.get("graph_runs") == 1, d


def _bad_cases():
    st = _step(STEPS["decode"], 4, 2, torch.float32, seed=1)
    q, k, v, sm = st["query"], st["key"], st["value"], st["slot_mapping"]
    cs, qi, qp, oi = st["meta"]
    c = st["cache"]
    cases = {
        "rac: float slots": ("rac", (c, k, v, sm.float()), "slot_mapping must be int32 or int64"),
        "rac: 2-d slots": ("rac", (c, k, v, sm.view(-1, 1)), "slot_mapping must have 1 dims"),
        "rac: key heads": ("rac", (c, k.repeat(1, 2, 1), v, sm), "key must be"),
        "rac: int cache": ("rac", (c.long(), k, v, sm), "kv_cache must be floating point"),
        "rac: 3-d cache": ("rac", (c[0], k, v, sm), "kv_cache must be"),
        "pa: heads not multiple": ("pa", (q[:, :3], c, cs, qi, qp, oi), "not a multiple"),
        "pa: head size": ("pa", (q[..., :4], c, cs, qi, qp, oi), "query must be"),
        "pa: int query": ("pa", (q.long(), c, cs, qi, qp, oi), "query must be floating point"),
        "pa: float metadata": ("pa", (q, c, cs.float(), qi, qp, oi), "context_slots must be int"),
        "pa: rank": ("pa", (q, c, cs, qi.view(-1), qp, oi), "query_index must have 2 dims"),
        "pa: R mismatch": ("pa", (q, c, cs[:1], qi, qp, oi), "must both be [R, Q]"),
        "pa: T mismatch": ("pa", (q, c, cs, qi, qp, oi[:1]), "output_index must be"),
    }
    return cases


@pytest.mark.parametrize("case", sorted(_bad_cases()))
def test_bad_input_raises(case):
    which, args, msg = _bad_cases()[case]
    op = torch.ops.tpu.reshape_and_cache if which == "rac" else torch.ops.tpu.paged_attention
    extra = () if which == "rac" else (0.5,)
    with pytest.raises(ValueError, match=re.escape(msg)):  # CPU tensors: the same checks
        op(*args, *extra)
    with pytest.raises(ValueError, match=re.escape(msg)):
        op(*(a.to(TPU) for a in args), *extra)
    torch.tpu.synchronize()  # and the device is still fine afterwards
    assert torch.ones(2, device=TPU).sum().item() == 2


def test_metadata_builder():
    # 3 requests: a 3-token chunk at positions 2..4, a decode at 1, a decode at 0
    bt = np.array([[2, 0], [1, 9], [5, 0]])
    cs, qi, qp, oi, sm = pa.build_metadata([0, 3, 4, 5], [5, 2, 1], bt, 4)
    # R 3 -> 4 rows, Q 3 -> 4, S 5 -> 8 (a multiple of the block size)
    assert cs.tolist() == [[8, 9, 10, 11, 0, 1, 2, 3], [4, 5, 6, 7, 36, 37, 38, 39],
                           [20, 21, 22, 23, 0, 1, 2, 3], [0, 1, 2, 3] * 2]
    assert qi.tolist() == [[0, 1, 2, 0], [3, 0, 0, 0], [4, 0, 0, 0], [0, 0, 0, 0]]
    assert qp.tolist() == [[2, 3, 4, -1], [1, -1, -1, -1], [0, -1, -1, -1], [-1] * 4]
    assert oi.tolist() == [0, 1, 2, 4, 8]
    assert sm.tolist() == [10, 11, 0, 5, 20]
    # the device form of context_slots (from a block table tensor) is the same
    assert torch.equal(pa.context_slots(torch.from_numpy(bt).to(TPU), 4, 8, 4).cpu(),
                       torch.from_numpy(cs))


@pytest.mark.parametrize("device", ["cpu", "tpu"])
def test_empty_step_and_slots_past_the_end(device):
    cache = torch.zeros(4, BS, 2, 2 * D, device=device)

    def z(*shape):
        return torch.zeros(*shape, dtype=torch.long, device=device)

    empty = torch.zeros(0, 2, D, device=device)
    torch.ops.tpu.reshape_and_cache(cache, empty, empty, z(0))
    out = torch.ops.tpu.paged_attention(torch.zeros(0, 4, D, device=device), cache, z(1, 4),
                                        z(1, 1), z(1, 1) - 1, z(0), 0.5)
    assert out.shape == (0, 4, D)
    # padding slots (negative) write nothing
    ones = torch.ones(2, 2, D, device=device)
    torch.ops.tpu.reshape_and_cache(cache, ones, ones, torch.tensor([-1, 3], device=device))
    flat = cache.cpu().view(-1, 2, 2 * D)
    assert flat[3].eq(1).all() and flat.sum() == 2 * 2 * D


@pytest.mark.parametrize("device,mode", [("cpu", "strict"), ("tpu", "strict"), ("tpu", "debug"),
                                         ("tpu", "defer_and_fuse")])
def test_metadata_out_of_range_raises_and_writes_nothing(device, mode):
    """A slot past the cache, or query/output rows past their ranges, are the caller's bug:
    CPU's IndexError (on tpu at the next synchronization, as the device-side index checks
    report indexing ops), and the in-place op writes nothing."""
    cache = torch.zeros(4, BS, 2, 2 * D, device=device)
    msg = f"index {4 * BS} is out of bounds for dimension 0 with size {4 * BS}"
    ones = torch.ones(2, 2, D, device=device)
    with torch.tpu.eager_mode(mode):
        with pytest.raises(IndexError, match=msg):
            torch.ops.tpu.reshape_and_cache(cache, ones, ones,
                                            torch.tensor([3, 4 * BS], device=device))
            cache.cpu()
        assert cache.cpu().eq(0).all()
        q = torch.ones(2, 4, D, device=device)
        out = torch.full((2, 4, D), 7.0, device=device)

        def z(*shape, v=0):
            return torch.full(shape, v, dtype=torch.long, device=device)

        cases = [  # context_slots, query_index, output_index, message
            (z(1, 4, v=4 * BS), z(1, 2), torch.arange(2, device=device), msg),
            (z(1, 4), z(1, 2, v=5), torch.arange(2, device=device),
             "index 5 is out of bounds for dimension 0 with size 2"),
            (z(1, 4), z(1, 2), torch.tensor([0, 2], device=device),
             "index 2 is out of bounds for dimension 0 with size 2"),
        ]
        for cs, qi, oi, m in cases:
            with pytest.raises(IndexError, match=m):
                torch.ops.tpu.paged_attention_into(out, q, cache, cs, qi, z(1, 2), oi, 0.5)
                out.cpu()
            assert out.cpu().eq(7).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_two_grids_fill_one_output(dtype):
    """Decodes and prefills as two grids (Q 1 and Q 8) over one output: output_index -1 marks
    the other grid's tokens, whose rows paged_attention_into leaves alone and paged_attention
    leaves 0."""
    reqs = [(9, 1), (7, 5), (12, 1), (3, 3)]
    st = _step(reqs, 4, 2, dtype, seed=21)
    qsl = np.cumsum([0] + [n for _, n in reqs])
    seq = [L for L, _ in reqs]
    cache = st["cache"].to(TPU)
    torch.ops.tpu.reshape_and_cache(cache, st["key"].to(TPU), st["value"].to(TPU),
                                    st["slot_mapping"].to(TPU))
    q = st["query"].to(TPU)
    t = q.shape[0]
    out = torch.full((t, 4, D), 5.0, dtype=dtype, device=TPU)
    bt = st["block_table"]
    for group in ([0, 2], [1, 3]):
        cs, qi, qp, oi, _ = pa.build_metadata(qsl, seq, bt, BS, requests=group)
        assert qi.shape == ((2, 1) if group == [0, 2] else (2, 8))
        md = [torch.from_numpy(a).to(TPU) for a in (cs, qi, qp, oi)]
        alone = torch.ops.tpu.paged_attention(q, cache, *md, 0.3).cpu()
        assert torch.equal(alone[torch.from_numpy(oi) < 0], torch.zeros_like(alone[oi < 0]))
        cpu = torch.ops.tpu.paged_attention(q.cpu(), cache.cpu(), *(m.cpu() for m in md), 0.3)
        torch.testing.assert_close(alone, cpu, **TOL[dtype])
        torch.ops.tpu.paged_attention_into(out, q, cache, *md, 0.3)
    torch.testing.assert_close(out.cpu(), _reference(st, 0.3), **TOL[dtype])


def test_split_requests():
    assert pa.split_requests([1, 1, 1]) == [None]  # decodes only
    assert pa.split_requests([5, 3]) == [None]  # prefills only
    assert pa.split_requests([1, 2]) == [None]  # 2 rows x 2 vs 1 + 2: not worth a second call
    d, r = pa.split_requests([1, 128, 1, 1, 1, 1, 1, 1, 1])  # 8 decodes and a 128-token chunk
    assert d.tolist() == [0, 2, 3, 4, 5, 6, 7, 8] and r.tolist() == [1]
