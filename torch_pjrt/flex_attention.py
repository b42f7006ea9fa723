"""FlexAttention (``torch.nn.attention.flex_attention``) on ``tpu``, eager and under
``torch.compile``.

Two things stand between PyTorch's FlexAttention and this device, and ``install()`` handles both:

- **The device check.** ``flex_attention()`` validates its inputs' device against a fixed set
  (``_validate_device`` in torch/nn/attention/flex_attention.py: cuda, cpu, xpu, hpu, mps; marked
  there as a TODO until other devices are supported) and raises ``ValueError`` for ``tpu``, in
  eager and equally while Dynamo traces it. The check is wrapped so that ``tpu`` inputs pass;
  every other device gets PyTorch's own check and messages unchanged.
- **The kernels.** ``flex_attention`` is a higher-order op (``torch.ops.higher_order.flex_attention``):
  Dynamo puts it whole into a graph, with the score_mod and mask_mod as subgraphs, and
  AOTAutograd keeps it as one node, its backward as one ``flex_attention_backward`` node. This
  module registers both ops' kernels for this device (their ``PrivateUse1`` implementations),
  which eager calls (through the op's own autograd function) and this backend's compiled graphs
  (each node run under the graph's capture) both reach. PyTorch's device-generic
  implementations (``CompositeExplicitAutograd``) would compute the same values, but both upload
  a host constant (``torch.tensor(-inf, device=...)``) in the middle, which ends a DeferAndFuse
  run and breaks a compiled graph's capture (the graph then ran op by op on every call). The
  kernels here compute the same functions from device ops only, so each compiled graph holding
  flex_attention (forward, backward) is one program.

What the forward computes (the op's contract, as PyTorch's own implementations do): scores
``q @ k^T * scale`` in float32 (float64 for float64 inputs), ``score_mod`` applied to every
score, positions where ``mask_mod`` is False set to -inf, then softmax (a row with nothing
left gives zeros, not NaN) and ``@ v``; GQA (``enable_gqa``: each kv head serves
``Hq // Hkv`` query heads) and a key/value batch of 1 broadcast over the query batch. It
returns the output in the query's strides, the row logsumexp and the row maximum, both in
base 2 (-inf for empty rows), as the op's callers expect. The backward differentiates that
(the score_mod through its joint graph, which also gives the gradients of tensors the
score_mod captures). Limit: the mask is applied densely, so the block structure of a
``BlockMask`` is not used to skip work (every score is computed and materialized, B x H x L x S).
"""
from __future__ import annotations

import math

import torch

_installed = False


def _expand_heads(t, batch, group):
    """(Bkv, Hkv, S, D) -> (batch, Hkv * group, S, D): a key/value batch of 1 broadcast over
    the query batch, each kv head serving `group` consecutive query heads (GQA)."""
    t = t.expand((batch,) + tuple(t.shape[1:]))
    if group == 1:
        return t
    b, h, s, d = t.shape
    return t.unsqueeze(2).expand(b, h, group, s, d).reshape(b, h * group, s, d)


def _bhqkv(fn, batched_prefix, batched_suffix, out_dims=0):
    # PyTorch's vmap over (b, h, q, kv), which score_mod/mask_mod callables are written for
    from torch.nn.attention.flex_attention import _vmap_for_bhqkv
    return _vmap_for_bhqkv(fn, prefix=batched_prefix, suffix=batched_suffix, out_dims=out_dims)


def _masked_scores(query, key, score_mod, block_mask, scale, score_buffers, mask_buffers):
    """(raw scores, scores after score_mod with masked positions at -inf, the mask, -inf as a
    device scalar, the index vectors b, h, q, kv), in the working precision."""
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex

    work = torch.float64 if query.dtype == torch.float64 else torch.float32
    scores = (query.to(work) @ key.to(work).transpose(-2, -1)) * scale
    dev = scores.device
    index = tuple(torch.arange(size, device=dev) for size in scores.shape)
    scored = _bhqkv(score_mod, (0,), (None,) * len(score_buffers))
    masked = _bhqkv(block_mask[-1], (), (None,) * len(mask_buffers))
    with TransformGetItemToIndex():  # tensor indexing inside the mods, as PyTorch traces it
        keep = masked(*index, *mask_buffers)
        modded = scored(scores, *index, *score_buffers)
    neg_inf = torch.full((), -math.inf, dtype=work, device=dev)  # made on the device: no upload
    return scores, torch.where(keep, modded, neg_inf), keep, neg_inf, index


def _dense_flex_attention(query, key, value, score_mod, block_mask, scale, kernel_options,
                          score_mod_other_buffers=(), mask_mod_other_buffers=()):
    from torch._higher_order_ops.flex_attention import _permute_strides

    bq, bkv = query.size(0), key.size(0)
    if not (bq == bkv or (bq > 1 and bkv == 1)):
        raise RuntimeError(f"Bq and Bkv must broadcast. Got Bq={bq} and Bkv={bkv}")
    group = query.size(1) // key.size(1)
    key, value = _expand_heads(key, bq, group), _expand_heads(value, bq, group)
    _, post, _, neg_inf, _ = _masked_scores(query, key, score_mod, block_mask, scale,
                                            score_mod_other_buffers, mask_mod_other_buffers)
    empty_rows = (post == -math.inf).all(dim=-1)
    lse = torch.where(empty_rows, neg_inf, post.logsumexp(dim=-1))
    row_max = post.amax(dim=-1)
    probs = torch._safe_softmax(post, dim=-1)
    out = _permute_strides(probs.to(query.dtype) @ value.to(query.dtype), query.stride())
    return out, lse / math.log(2), row_max / math.log(2)


def _dense_flex_attention_backward(query, key, value, out, logsumexp, grad_out, grad_logsumexp,
                                   fw_graph, joint_graph, block_mask, scale, kernel_options,
                                   score_mod_other_buffers=(), mask_mod_other_buffers=()):
    """The gradients of `_dense_flex_attention` for query, key, value and the score_mod's
    captured buffers, in the inputs' strides; `logsumexp` (and its gradient) in base 2, as the
    forward returns it. `joint_graph`: the score_mod's forward+backward (built here when the
    caller passes none, as PyTorch's own implementation does)."""
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
    from torch._higher_order_ops.flex_attention import _permute_strides, create_fw_bw_graph

    if query.dtype != key.dtype or query.dtype != value.dtype:
        raise ValueError(
            f"Backward pass with mixed query, key, and value dtype is not supported, "
            f"got query.dtype={query.dtype}, key.dtype={key.dtype}, "
            f"and value.dtype={value.dtype}")
    if joint_graph is None:
        examples = (query.new_zeros((), requires_grad=True),) + tuple(
            query.new_zeros((), dtype=torch.int) for _ in range(4))
        _, joint_graph = create_fw_bw_graph(fw_graph, examples, score_mod_other_buffers)
    bq, hq = query.size(0), query.size(1)
    bkv, hkv = key.size(0), key.size(1)
    if not (bq == bkv or (bq > 1 and bkv == 1)):
        raise RuntimeError(f"Bq and Bkv must broadcast. Got Bq={bq} and Bkv={bkv}")
    group = hq // hkv
    k_full, v_full = _expand_heads(key, bq, group), _expand_heads(value, bq, group)
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    if grad_logsumexp is None:
        grad_logsumexp = torch.zeros_like(logsumexp)
    lse = logsumexp * math.log(2)  # natural log, as the scores are
    grad_lse = grad_logsumexp / math.log(2)
    scores, post, keep, _, index = _masked_scores(query, k_full, fw_graph, block_mask, scale,
                                                  score_mod_other_buffers, mask_mod_other_buffers)
    work = scores.dtype
    probs = torch.exp(post - lse.unsqueeze(-1))
    probs = torch.where((lse == -math.inf).unsqueeze(-1), torch.zeros_like(probs), probs)
    grad_v = probs.to(query.dtype).transpose(-2, -1) @ grad_out
    grad_probs = grad_out.to(work) @ v_full.to(work).transpose(-2, -1)
    row_dot = (out.to(work) * grad_out.to(work)).sum(dim=-1, keepdim=True)
    grad_post = probs * (grad_probs - row_dot + grad_lse.unsqueeze(-1))
    nbuf = len(score_mod_other_buffers)
    joint = _bhqkv(joint_graph, (0,), (0,) + (None,) * nbuf,
                   out_dims=[0, None, None, None, None] + [None] * nbuf)
    with TransformGetItemToIndex():
        grad_scores, _, _, _, _, *grad_buffers = joint(scores, *index, grad_post,
                                                       *score_mod_other_buffers)
    grad_scores = (grad_scores * scale).to(query.dtype)
    grad_scores = torch.where(keep, grad_scores, torch.zeros_like(grad_scores))
    grad_q = grad_scores @ k_full.to(query.dtype)
    grad_k = grad_scores.transpose(-2, -1) @ query

    def per_kv_head(g):  # (Bq, Hq, S, D) -> (Bq, Hkv, S, D): the group's query heads summed
        return g.view(g.size(0), hkv, group, g.size(-2), g.size(-1)).sum(dim=2)

    grad_k, grad_v = per_kv_head(grad_k), per_kv_head(grad_v)
    if bq != bkv:  # a broadcast key/value batch gets the sum over the query batch
        grad_k, grad_v = grad_k.sum(0, keepdim=True), grad_v.sum(0, keepdim=True)
    grad_q = _permute_strides(query.new_empty(query.shape), query.stride()).copy_(grad_q)
    grad_k = _permute_strides(key.new_empty(key.shape), key.stride()).copy_(grad_k)
    grad_v = _permute_strides(value.new_empty(value.shape), value.stride()).copy_(grad_v)
    buffer_grads = tuple(
        torch.empty_like(buf, memory_format=torch.contiguous_format).copy_(g)
        if isinstance(buf, torch.Tensor) and buf.requires_grad else None
        for buf, g in zip(score_mod_other_buffers, grad_buffers))
    return grad_q, grad_k, grad_v, buffer_grads


def install() -> None:
    """Idempotent; cheap (PyTorch imports the op's module with itself)."""
    global _installed
    if _installed:
        return
    _installed = True
    from torch._higher_order_ops.flex_attention import (flex_attention as forward_op,
                                                        flex_attention_backward as backward_op)
    import torch.nn.attention.flex_attention as frontend

    forward_op.py_impl(torch._C.DispatchKey.PrivateUse1)(_dense_flex_attention)
    backward_op.py_impl(torch._C.DispatchKey.PrivateUse1)(_dense_flex_attention_backward)

    pytorch_check = frontend._validate_device

    def _validate_device(query, key, value):
        if query.device.type == "tpu":
            return None
        return pytorch_check(query, key, value)

    _validate_device.__wrapped__ = pytorch_check
    frontend._validate_device = _validate_device
