"""torch.nn.attention.flex_attention on tpu (torch_pjrt/flex_attention.py), eager and compiled.

References: CPU's own flex_attention for forward values (output and logsumexp); for gradients,
which CPU's flex_attention does not compute ("does not support backward on CPU"), the same
attention written densely in float64 on CPU and differentiated by autograd."""
import math

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

B, HQ, L, E = 2, 4, 256, 16


def causal(b, h, q, kv):
    return q >= kv


def rows_from_8(b, h, q, kv):  # query rows below 8 see nothing: fully masked rows
    return (q >= 8) & (q >= kv)


def relative_bias(score, b, h, q, kv):
    return score + (q - kv).float() * 0.01


WINDOW = 48
PREFIX = 40
_DOC_BOUNDS = (0, 70, 150, 151, 256)  # four documents, one of a single token
DOC_ID = torch.cat([torch.full((b - a,), i) for i, (a, b) in
                    enumerate(zip(_DOC_BOUNDS, _DOC_BOUNDS[1:]))])


def sliding_window(b, h, q, kv):
    return (q >= kv) & (q - kv < WINDOW)


def prefix_lm(b, h, q, kv):
    return (kv < PREFIX) | (q >= kv)


def _alibi_slope(h):  # 2^(-8 (h + 1) / H), as ALiBi's heads
    return torch.exp2(-8.0 * (h + 1) / HQ)


def alibi(score, b, h, q, kv):
    return score - _alibi_slope(h) * (q - kv).abs()


def _document_mask(doc_id):
    def document(b, h, q, kv):  # causal within each document; doc_id is a captured tensor
        return (doc_id[q] == doc_id[kv]) & (q >= kv)
    return document


def _dense_bias(kind, shape):
    """The score_mod's additive term as a float64 (H, L, L) table, for the dense reference."""
    idx = torch.arange(L).double()
    rel = idx[:, None] - idx[None, :]
    if kind == "relative":
        return (rel * 0.01).expand(shape)
    if kind == "alibi":
        slopes = _alibi_slope(torch.arange(HQ).double())
        return -slopes[:, None, None] * rel.abs()[None]
    return torch.zeros(shape, dtype=torch.float64)


CASES = {  # name: (mask_mod maker for a device, score_mod, dense bias kind)
    "causal": (lambda dev: causal, None, None),
    "causal+relative": (lambda dev: causal, relative_bias, "relative"),
    "sliding_window": (lambda dev: sliding_window, None, None),
    "document": (lambda dev: _document_mask(DOC_ID.to(dev)), None, None),
    "prefix_lm": (lambda dev: prefix_lm, None, None),
    "causal+alibi": (lambda dev: causal, alibi, "alibi"),
}


def _inputs(hkv=HQ, seed=0, length=L):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, HQ, length, E, generator=g), torch.randn(B, hkv, length, E, generator=g),
            torch.randn(B, hkv, length, E, generator=g))


def _dense(q, k, v, keep, bias=None, head_bias=None):
    """float64 attention: scores, an additive (H, L, L) bias table / a per-head bias, the
    mask; rows with nothing kept give zeros; returns (out, natural-log logsumexp)."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    if bias is not None:
        s = s + bias[None]
    if head_bias is not None:
        s = s + head_bias.double()[None, :, None, None]
    s = s.masked_fill(~keep, -math.inf)
    lse = s.logsumexp(-1)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    return p @ v, lse


def _keep(mask_mod, length=L):
    idx = torch.arange(length)
    return mask_mod(0, 0, idx[:, None], idx[None, :])


def _close(a, b, tol=2e-5):
    torch.testing.assert_close(a.detach().cpu().double(), b.detach().double(), rtol=tol, atol=tol)


# eager: every mask/score_mod with as many kv heads as query heads, two of them with GQA (2 kv
# heads); compiled (plain torch.compile): three of them, one with GQA
PARAMS = ([(case, HQ, False) for case in sorted(CASES)]
          + [("causal+relative", 2, False), ("document", 2, False)]
          + [("causal+relative", HQ, True), ("sliding_window", HQ, True), ("document", 2, True)])


@pytest.mark.parametrize("case,hkv,compiled", PARAMS)
def test_flex_attention_values_and_gradients_match(case, hkv, compiled):
    make_mask, score_mod, bias_kind = CASES[case]
    q, k, v = _inputs(hkv)
    gqa = hkv != HQ
    bm_cpu = create_block_mask(make_mask("cpu"), B, HQ, L, L, device="cpu")
    ref_out, ref_lse = flex_attention(q, k, v, score_mod=score_mod, block_mask=bm_cpu,
                                      enable_gqa=gqa, return_lse=True)
    bm = create_block_mask(make_mask("tpu"), B, HQ, L, L, device="tpu")
    assert bm.kv_num_blocks.device.type == "tpu"
    qt, kt, vt = (t.to("tpu").requires_grad_() for t in (q, k, v))
    fn = torch.compile(flex_attention) if compiled else flex_attention  # plain: no backend=
    torch._dynamo.reset()
    before = torch.tpu.metrics()
    out, lse = fn(qt, kt, vt, score_mod=score_mod, block_mask=bm, enable_gqa=gqa,
                  return_lse=True)
    assert out.device.type == "tpu" and out.shape == ref_out.shape and out.dtype == ref_out.dtype
    _close(out, ref_out)
    _close(lse, ref_lse)
    (out * torch.linspace(-1, 1, E, device="tpu")).sum().backward()
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    bias = _dense_bias(bias_kind, (HQ, L, L)) if bias_kind else None
    dense_out, _ = _dense(qd, kd, vd, _keep(make_mask("cpu")), bias=bias)
    _close(dense_out, ref_out)  # the dense reference is the function CPU's flex_attention computes
    (dense_out * torch.linspace(-1, 1, E).double()).sum().backward()
    for t, d in ((qt, qd), (kt, kd), (vt, vd)):
        assert t.grad.shape == t.shape
        _close(t.grad, d.grad, tol=5e-5)
    if compiled:  # forward and backward each one captured program
        after = torch.tpu.metrics()
        assert after["graph_runs"] - before["graph_runs"] == 2, (before, after)
        assert after["graph_captures_broken"] == before["graph_captures_broken"]


def test_fully_masked_rows_give_zeros_and_minus_inf_lse():
    q, k, v = _inputs()
    bm = create_block_mask(rows_from_8, B, HQ, L, L, device="tpu")
    qt, kt, vt = (t.to("tpu").requires_grad_() for t in (q, k, v))
    out, lse = flex_attention(qt, kt, vt, block_mask=bm, return_lse=True)
    ref_out, ref_lse = flex_attention(q, k, v, block_mask=create_block_mask(
        rows_from_8, B, HQ, L, L, device="cpu"), return_lse=True)
    _close(out, ref_out)
    assert torch.equal(lse[..., :8].cpu(), ref_lse[..., :8]) and bool((ref_lse[..., :8] == -math.inf).all())
    _close(lse[..., 8:], ref_lse[..., 8:])
    out.sum().backward()
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    _dense(qd, kd, vd, _keep(rows_from_8))[0].sum().backward()
    for t, d in ((qt, qd), (kt, kd), (vt, vd)):
        assert not t.grad.isnan().any()
        _close(t.grad, d.grad, tol=5e-5)


@pytest.mark.parametrize("compiled", [False, True])
def test_score_mod_buffer_gets_its_gradient(compiled):
    q, k, v = _inputs()
    table = torch.randn(HQ, generator=torch.Generator().manual_seed(3))
    tt = table.to("tpu").requires_grad_()

    def head_bias(score, b, h, q_idx, kv_idx):
        return score + tt[h]

    qt, kt, vt = (t.to("tpu").requires_grad_() for t in (q, k, v))
    fn = torch.compile(flex_attention, backend="tpu") if compiled else flex_attention
    torch._dynamo.reset()
    out = fn(qt, kt, vt, score_mod=head_bias,
             block_mask=create_block_mask(causal, B, HQ, L, L, device="tpu"))
    out.pow(2).sum().backward()
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    td = table.double().requires_grad_()
    ref, _ = _dense(qd, kd, vd, _keep(causal), head_bias=td)
    ref.pow(2).sum().backward()
    _close(out, ref)
    _close(tt.grad, td.grad, tol=1e-4)
    _close(qt.grad, qd.grad, tol=5e-5)


def test_create_block_mask_on_tpu_equals_cpu():
    for mask_mod in (causal, rows_from_8):
        c = create_block_mask(mask_mod, B, HQ, L, L, device="cpu")
        t = create_block_mask(mask_mod, B, HQ, L, L, device="tpu")
        for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                     "q_num_blocks", "q_indices"):
            a, b = getattr(c, name), getattr(t, name)
            assert b.device.type == "tpu" and torch.equal(a, b.cpu()), name


def test_defer_and_fuse_runs_flex_attention_without_a_flush():
    """The BlockMask's block lists are read on the host once (which runs what was recorded
    before); later calls with the same mask (a model's other layers) only record their ops."""
    q, k, v = (t.to("tpu") for t in _inputs())
    bm = create_block_mask(causal, B, HQ, L, L, device="tpu")
    max_ops = torch.tpu._C._defer_max_ops()
    torch.tpu._C._defer_set_max_ops(100000)  # one graph for the whole call (not cut at 64 ops)
    try:
        _defer_and_fuse_calls(q, k, v, bm)
    finally:
        torch.tpu._C._defer_set_max_ops(max_ops)


def _defer_and_fuse_calls(q, k, v, bm):
    with torch.tpu.eager_mode("defer_and_fuse"):
        flex_attention(q, k, v, block_mask=bm)
        torch.tpu.synchronize()
        before = torch.tpu.metrics()
        out = flex_attention(q, k, v, score_mod=relative_bias, block_mask=bm)
        after = torch.tpu.metrics()
        assert after["defer_flushes"] == before["defer_flushes"]  # recorded, nothing run yet
        assert after["transfers_to_host"] == before["transfers_to_host"]
        got = out.cpu()
    ref = flex_attention(*_inputs(), score_mod=relative_bias,
                         block_mask=create_block_mask(causal, B, HQ, L, L, device="cpu"))
    _close(got, ref)


def test_other_devices_keep_pytorchs_device_check():
    q, k, v = (t.to("meta") for t in _inputs())
    with pytest.raises(ValueError, match="only supported on CUDA, CPU"):
        flex_attention(q, k, v)


def test_block_sparsity_skips_the_blocks_the_mask_excludes():
    """The kernels compute, per query block, only the key blocks its BlockMask lists: a causal
    mask at sequence 2048 (16 blocks of 128) computes 136 of the 256 blocks of scores (53%);
    a sliding window 2 or 3 blocks per row; no mask, everything (one dense piece)."""
    from torch_pjrt import flex_attention as fx

    def fraction(mask_mod, n):
        bm = create_block_mask(mask_mod, 1, 1, n, n, device="tpu")
        return fx.computed_fraction(bm.as_tuple(), n, n)

    assert fraction(causal, 2048) == 136 / 256
    assert fraction(sliding_window, 2048) <= 2.0 / 16
    assert fraction(lambda b, h, q, kv: q >= 0, 2048) == 1.0
    # a prefix seen by every row, else only the row's own block: at 4 blocks, the last
    # block's key ranges are the prefix's block and its own, apart
    n = 512

    def prefix_or_own_block(b, h, q, kv):
        return (kv < PREFIX) | (q // 128 == kv // 128)

    bm = create_block_mask(prefix_or_own_block, 1, 1, n, n, device="tpu")
    assert fx._sparse_plan(bm.as_tuple(), n, n)[-1] == (n - 128, n, [(0, 128), (n - 128, n)])
    q, k, v = _inputs(length=n)
    ref = flex_attention(q, k, v, block_mask=create_block_mask(prefix_or_own_block, B, HQ, n, n,
                                                               device="cpu"))
    qt, kt, vt = (t.to("tpu").requires_grad_() for t in (q, k, v))
    got = flex_attention(qt, kt, vt, block_mask=create_block_mask(prefix_or_own_block, B, HQ,
                                                                  n, n, device="tpu"))
    _close(got, ref)
    got.pow(2).sum().backward()
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    _dense(qd, kd, vd, _keep(prefix_or_own_block, n))[0].pow(2).sum().backward()
    for t, d in ((qt, qd), (kt, kd), (vt, vd)):
        _close(t.grad, d.grad, tol=5e-5)


def test_compiled_graph_keeps_programs_for_a_bounded_number_of_masks(monkeypatch):
    """A compiled graph keeps block-sparse programs per BlockMask for MAX_MASKS_PER_GRAPH
    masks; further masks (document masks that change every batch) share one dense program
    instead of a compile each. Values stay CPU's for every mask."""
    from torch_pjrt.compile import graph_runner

    monkeypatch.setattr(graph_runner, "MAX_MASKS_PER_GRAPH", 1)

    def doc_ids(bounds):
        return torch.cat([torch.full((b - a,), i) for i, (a, b) in
                          enumerate(zip(bounds, bounds[1:]))])

    layouts = [(0, 100, 200, 256), (0, 128, 256), (0, 20, 40, 256), (0, 100, 200, 256)]
    q, k, v = _inputs()
    qt, kt, vt = (t.to("tpu") for t in (q, k, v))
    doc_t = doc_ids(layouts[0]).to("tpu")
    document_t = _document_mask(doc_t)  # one mask_mod, its captured ids changed in place
    torch._dynamo.reset()
    fn = torch.compile(flex_attention)
    captures = []
    for bounds in layouts:
        doc_t.copy_(doc_ids(bounds).to("tpu"))
        before = torch.tpu.metrics()["graph_captures"]
        with torch.no_grad():
            got = fn(qt, kt, vt, block_mask=create_block_mask(document_t, B, HQ, L, L,
                                                              device="tpu"))
        captures.append(torch.tpu.metrics()["graph_captures"] - before)
        document = _document_mask(doc_ids(bounds))
        _close(got, flex_attention(q, k, v, block_mask=create_block_mask(document, B, HQ, L, L,
                                                                          device="cpu")))
    # the first layout: its sparse program; the second: the dense one; the third: the dense
    # one again; the first again: its sparse program again
    assert captures == [1, 1, 0, 0], captures


def test_compiled_layers_read_a_shared_mask_once_per_step():
    """A BlockMask shared by a model's layers is read on the host once, not before every
    compiled graph's call: every read waits for the device (a torchtitan llama3 step spent 44%
    of its time in 48 such reads of one mask). Per training step: the mask's four block
    lists and the loss; the gradients stay CPU's (float64 dense attention as reference)."""
    layers = 3
    torch.manual_seed(0)
    q0, k0, v0 = _inputs()
    weights = [torch.randn(E, E) / math.sqrt(E) for _ in range(layers)]

    def model(x, block_mask, ws, attend):
        for w in ws:
            h = x @ w
            x = x + attend(h, h, h, block_mask)
        return x.pow(2).mean()

    def flex(q, k, v, bm):
        return flex_attention(q, k, v, block_mask=bm)

    wt = [w.to("tpu").requires_grad_() for w in weights]
    xt = q0.to("tpu")
    torch._dynamo.reset()
    step = torch.compile(lambda x, bm: model(x, bm, wt, flex), backend="tpu")
    reads = []
    for _ in range(3):
        bm = create_block_mask(causal, B, HQ, L, L, device="tpu")
        torch.tpu.synchronize()
        before = torch.tpu.metrics()["transfers_to_host"]
        for w in wt:
            w.grad = None
        loss = step(xt, bm)
        loss.backward()
        loss_value = loss.item()
        reads.append(torch.tpu.metrics()["transfers_to_host"] - before)
    assert reads[1:] == [5, 5], reads  # 4 block lists + the loss, whatever the layer count

    keep = _keep(causal, L)
    wd = [w.double().requires_grad_() for w in weights]
    ref = model(q0.double(), None, wd, lambda q, k, v, _: _dense(q, k, v, keep)[0])
    ref.backward()
    assert math.isclose(loss_value, ref.item(), rel_tol=1e-4)
    for t, d in zip(wt, wd):
        _close(t.grad, d.grad, tol=5e-5)
