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
score_mod captures). Both skip the key blocks a ``BlockMask`` excludes (block sparsity,
below): per query block, only the key blocks some (batch, head) attends to are computed (a
causal mask: 136 of 256 blocks at sequence 2048). Limits: the blocks kept are the union over
batch and heads; each piece's scores are materialized (no online softmax); the block lists are
host data, read once per mask in eager (a flush of DeferAndFuse's recorded ops) and once per
call of a compiled graph, whose programs are kept per mask (for up to 8 masks; masks that
change every call, as document masking's do, then share one dense program).
"""
from __future__ import annotations

import contextlib
import math
import threading
import weakref

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


def _masked_scores(query, key, score_mod, mask_mod, scale, score_buffers, mask_buffers,
                   index=None):
    """(raw scores, scores after score_mod with masked positions at -inf, the mask, -inf as a
    device scalar, the index vectors b, h, q, kv), in the working precision. `index`: the
    (b, h, q, kv) positions of the scores' rows and columns, when they are not 0..n-1 (a
    block-sparse piece)."""
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex

    work = torch.float64 if query.dtype == torch.float64 else torch.float32
    scores = (query.to(work) @ key.to(work).transpose(-2, -1)) * scale
    dev = scores.device
    if index is None:
        index = tuple(torch.arange(size, device=dev) for size in scores.shape)
    scored = _bhqkv(score_mod, (0,), (None,) * len(score_buffers))
    masked = _bhqkv(mask_mod, (), (None,) * len(mask_buffers))
    with TransformGetItemToIndex():  # tensor indexing inside the mods, as PyTorch traces it
        keep = masked(*index, *mask_buffers)
        modded = scored(scores, *index, *score_buffers)
    neg_inf = torch.full((), -math.inf, dtype=work, device=dev)  # made on the device: no upload
    return scores, torch.where(keep, modded, neg_inf), keep, neg_inf, index


# ---- block sparsity -------------------------------------------------------------------------
# A BlockMask lists, for each block of BQ query rows, the blocks of BK keys that some position
# of it attends to (partial blocks in kv_indices, full ones in full_kv_indices); every other
# key is masked out by the mask_mod itself. The kernels compute, for each query block, only the
# key blocks that any (batch, head) lists for it, with the mask_mod applied to those as to
# all: the same values as the dense computation, on fewer scores (a causal mask: about half).
# Which blocks, is host data: the kernels read the BlockMask's four tensors on the host, once
# per tensor while it lives unchanged (a compiled graph needs them before each call, to keep
# its programs per their values: compile/graph_runner.py, `read_block_lists`), and build one
# piece of work per query block.

# (storage address, offset, sizes, strides, dtype) -> (weak reference, version, host copy): the
# last host read of a BlockMask tensor, valid while the tensor read lives unchanged. A model's
# layers share one mask: one read (in eager DeferAndFuse code, a flush of the recorded ops)
# serves them all, and a compiled graph's read before its call serves the kernels run inside it
# (a read inside a capture would end it). Keyed by the storage, not the tensor object: compiled
# graphs get the mask's tensors as other tensors on the same storage (AOTAutograd hands a
# backward graph detached aliases of the forward's inputs, Dynamo later calls' views), which
# share the read tensor's version counter, so an in-place change through any of them shows.
_host_reads = {}


def _key(t):
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(),
            t.dtype)


def _forget(ref, key):
    kept = _host_reads.get(key)
    if kept is not None and kept[0] is ref:  # not a newer read of the same storage
        del _host_reads[key]


def _read(t):
    host = t.cpu()
    key = _key(t)
    _host_reads[key] = (weakref.ref(t, lambda ref, key=key: _forget(ref, key)), t._version,
                        host)
    return host


def _host(t):
    if t is None:
        return None
    if t.device.type == "cpu":
        return t
    key = _key(t)
    kept = _host_reads.get(key)
    if kept is not None:
        read = kept[0]()
        # the tensor read still holds this storage (so the address was not reused) and
        # neither it nor `t` was written since
        if (read is not None and read.untyped_storage().data_ptr() == key[0]
                and read._version == kept[1] == t._version):
            return kept[2]
    return _read(t)


def read_block_lists(tensors) -> bytes:
    """For a compiled graph's call: a BlockMask's block-list tensors (its inputs) on the host,
    where the kernels run inside the call find them, as bytes: the key the graph keeps its
    programs under (a program specialized to one mask's blocks runs only for those). A tensor
    read before and unchanged since is not read again: every layer's forward, recompute and
    backward graph gets the same mask, and each read waits for the device (torchtitan's
    compiled llama3 debug model made 48 such reads of one mask per step)."""
    host = [_host(t) if isinstance(t, torch.Tensor) else t for t in tensors]
    return b"".join(repr((tuple(h.shape), h.dtype)).encode() + h.numpy().tobytes()
                    if isinstance(h, torch.Tensor) else repr(h).encode() for h in host)


_dense_only = threading.local()


@contextlib.contextmanager
def dense_kernels():
    """The kernels run inside compute every block (no host data needed): for a compiled graph
    that has met more masks than it keeps programs for."""
    before = getattr(_dense_only, "on", False)
    _dense_only.on = True
    try:
        yield
    finally:
        _dense_only.on = before


def block_mask_tensors(block_mask) -> tuple:
    """The BlockMask tuple's kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices."""
    return tuple(block_mask[2:6])


def _kv_blocks_per_q_block(block_mask):
    """For each query block, the sorted kv block numbers any (batch, head) lists for it."""
    kvn, kvi, fkvn, fkvi = (_host(t) for t in block_mask_tensors(block_mask))
    lists = []
    for i in range(kvn.shape[-1]):
        found = set()
        for num, idx in ((kvn, kvi), (fkvn, fkvi)):
            if num is None or idx is None:
                continue
            take = torch.arange(idx.shape[-1]) < num[..., i].unsqueeze(-1).long()
            found.update(idx[..., i, :][take].tolist())
        lists.append(sorted(found))
    return lists


def _runs(blocks, block, length):
    """Key positions of the listed blocks as contiguous (start, stop) ranges."""
    runs = []
    for j in blocks:
        a, b = j * block, min((j + 1) * block, length)
        if a >= b:
            continue
        if runs and runs[-1][1] == a:
            runs[-1] = (runs[-1][0], b)
        else:
            runs.append((a, b))
    return runs


def _take(t, runs):  # the key/value rows of the ranges, along dim 2
    parts = [t[:, :, a:b] for a, b in runs]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


def _sparse_plan(block_mask, q_len, kv_len):
    """[(q_start, q_stop, key ranges)] per query block, or None when every query block needs
    every key (nothing to skip: the dense computation)."""
    bq, bk = block_mask[-3], block_mask[-2]
    if bq >= q_len and bk >= kv_len:
        return None  # one block each way (no mask given: PyTorch's empty BlockMask)
    if getattr(_dense_only, "on", False):
        return None
    lists = _kv_blocks_per_q_block(block_mask)
    n_kv = -(-kv_len // bk)
    if all(len(blocks) == n_kv for blocks in lists):
        return None
    return [(i * bq, min((i + 1) * bq, q_len), _runs(blocks, bk, kv_len))
            for i, blocks in enumerate(lists) if i * bq < q_len]


def computed_fraction(block_mask, q_len, kv_len) -> float:
    """The share of the q_len x kv_len scores the kernels compute for this BlockMask tuple."""
    plan = _sparse_plan(block_mask, q_len, kv_len)
    if plan is None:
        return 1.0
    return sum((q1 - q0) * sum(b - a for a, b in runs) for q0, q1, runs in plan) / (
        q_len * kv_len)


def _piece_index(b, h, q0, q1, runs, dev):
    n = [torch.arange(a, c, device=dev) for a, c in runs]
    return (torch.arange(b, device=dev), torch.arange(h, device=dev),
            torch.arange(q0, q1, device=dev), n[0] if len(n) == 1 else torch.cat(n))


def _pieces(query, key, block_mask):
    """[(q_start, q_stop, key ranges or None for all keys)]: one piece for the whole attention,
    or one per query block with only its key blocks (block sparsity, above)."""
    plan = _sparse_plan(block_mask, query.size(-2), key.size(-2))
    return plan if plan is not None else [(0, query.size(-2), None)]


def _piece_inputs(query, key, value, q0, q1, runs):
    """The piece's query rows, keys, values and (b, h, q, kv) index vectors (None: 0..n-1)."""
    if runs is None:
        return query, key, value, None
    b, h = query.size(0), query.size(1)
    return (query[:, :, q0:q1], _take(key, runs), _take(value, runs),
            _piece_index(b, h, q0, q1, runs, query.device))


def _flex_attention(query, key, value, score_mod, block_mask, scale, kernel_options,
                    score_mod_other_buffers=(), mask_mod_other_buffers=()):
    from torch._higher_order_ops.flex_attention import _permute_strides

    bq, bkv = query.size(0), key.size(0)
    if not (bq == bkv or (bq > 1 and bkv == 1)):
        raise RuntimeError(f"Bq and Bkv must broadcast. Got Bq={bq} and Bkv={bkv}")
    group = query.size(1) // key.size(1)
    key, value = _expand_heads(key, bq, group), _expand_heads(value, bq, group)
    work = torch.float64 if query.dtype == torch.float64 else torch.float32
    outs, lses, maxes = [], [], []
    for q0, q1, runs in _pieces(query, key, block_mask):
        if runs == []:  # a query block that attends to no key: zeros, -inf
            rows = (bq, query.size(1), q1 - q0)
            outs.append(query.new_zeros(rows + (value.size(-1),)))
            lses.append(torch.full(rows, -math.inf, dtype=work, device=query.device))
            maxes.append(lses[-1])
            continue
        q, k, v, index = _piece_inputs(query, key, value, q0, q1, runs)
        _, post, _, neg_inf, _ = _masked_scores(q, k, score_mod, block_mask[-1], scale,
                                                score_mod_other_buffers,
                                                mask_mod_other_buffers, index)
        empty_rows = (post == -math.inf).all(dim=-1)
        lses.append(torch.where(empty_rows, neg_inf, post.logsumexp(dim=-1)))
        maxes.append(post.amax(dim=-1))
        outs.append(torch._safe_softmax(post, dim=-1).to(query.dtype) @ v.to(query.dtype))
    join = (lambda parts, dim: parts[0] if len(parts) == 1 else torch.cat(parts, dim))
    out = _permute_strides(join(outs, 2), query.stride())
    return out, join(lses, 2) / math.log(2), join(maxes, 2) / math.log(2)


def _flex_attention_backward(query, key, value, out, logsumexp, grad_out, grad_logsumexp,
                             fw_graph, joint_graph, block_mask, scale, kernel_options,
                             score_mod_other_buffers=(), mask_mod_other_buffers=()):
    """The gradients of `_flex_attention` for query, key, value and the score_mod's captured
    buffers, in the inputs' strides; `logsumexp` (and its gradient) in base 2, as the forward
    returns it. `joint_graph`: the score_mod's forward+backward (built here when the caller
    passes none, as PyTorch's own implementation does). Piece by piece as the forward."""
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
    lse_all = logsumexp * math.log(2)  # natural log, as the scores are
    grad_lse_all = grad_logsumexp / math.log(2)
    nbuf = len(score_mod_other_buffers)
    joint = _bhqkv(joint_graph, (0,), (0,) + (None,) * nbuf,
                   out_dims=[0, None, None, None, None] + [None] * nbuf)
    pieces = _pieces(query, k_full, block_mask)
    sparse = pieces[0][2] is not None
    # per query head: (Bq, Hq, S, D) sums, reduced to the kv heads at the end
    grad_k = query.new_zeros(k_full.shape) if sparse else None
    grad_v = query.new_zeros(v_full.shape) if sparse else None
    grad_qs, grad_buffers = [], None
    for q0, q1, runs in pieces:
        if runs == []:  # no key: nothing flows to any input
            grad_qs.append(query.new_zeros(query[:, :, q0:q1].shape))
            continue
        q, k, v, index = _piece_inputs(query, k_full, v_full, q0, q1, runs)
        rows = slice(q0, q1)
        lse, grad_lse = lse_all[:, :, rows], grad_lse_all[:, :, rows]
        g_out, o = grad_out[:, :, rows], out[:, :, rows]
        scores, post, keep, _, index = _masked_scores(q, k, fw_graph, block_mask[-1], scale,
                                                      score_mod_other_buffers,
                                                      mask_mod_other_buffers, index)
        work = scores.dtype
        probs = torch.exp(post - lse.unsqueeze(-1))
        probs = torch.where((lse == -math.inf).unsqueeze(-1), torch.zeros_like(probs), probs)
        piece_grad_v = probs.to(query.dtype).transpose(-2, -1) @ g_out
        grad_probs = g_out.to(work) @ v.to(work).transpose(-2, -1)
        row_dot = (o.to(work) * g_out.to(work)).sum(dim=-1, keepdim=True)
        grad_post = probs * (grad_probs - row_dot + grad_lse.unsqueeze(-1))
        with TransformGetItemToIndex():
            grad_scores, _, _, _, _, *piece_buffers = joint(scores, *index, grad_post,
                                                            *score_mod_other_buffers)
        grad_scores = (grad_scores * scale).to(query.dtype)
        grad_scores = torch.where(keep, grad_scores, torch.zeros_like(grad_scores))
        grad_qs.append(grad_scores @ k.to(query.dtype))
        piece_grad_k = grad_scores.transpose(-2, -1) @ q
        if not sparse:
            grad_k, grad_v = piece_grad_k, piece_grad_v
        else:  # each key range gets its rows of the piece's gradients
            at = 0
            for a, b in runs:
                grad_k[:, :, a:b].add_(piece_grad_k[:, :, at:at + b - a])
                grad_v[:, :, a:b].add_(piece_grad_v[:, :, at:at + b - a])
                at += b - a
        grad_buffers = piece_buffers if grad_buffers is None else [
            g if p is None else (p if g is None else g + p)
            for g, p in zip(grad_buffers, piece_buffers)]
    grad_q = grad_qs[0] if len(grad_qs) == 1 else torch.cat(grad_qs, dim=2)

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
        if isinstance(buf, torch.Tensor) and buf.requires_grad and g is not None else None
        for buf, g in zip(score_mod_other_buffers, grad_buffers or [None] * nbuf))
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

    forward_op.py_impl(torch._C.DispatchKey.PrivateUse1)(_flex_attention)
    backward_op.py_impl(torch._C.DispatchKey.PrivateUse1)(_flex_attention_backward)

    pytorch_check = frontend._validate_device

    def _validate_device(query, key, value):
        if query.device.type == "tpu":
            return None
        return pytorch_check(query, key, value)

    _validate_device.__wrapped__ = pytorch_check
    frontend._validate_device = _validate_device
