"""Paged attention for vLLM on the `tpu` device: two fused ops per layer.

The KV cache of a layer is one tensor, physically [num_blocks, block_size, num_kv_heads,
2*head_size] (vLLM's LBNHC layout: keys in the first head_size channels, values in the rest),
which vLLM hands to forward() as its logical [num_blocks, num_kv_heads, block_size,
2*head_size] view. A token's slot is block * block_size + offset.

One step's batch may mix prefills, chunked prefills and decodes. The metadata builder does the
per-step bookkeeping once for all layers on the host (numpy; torch_pjrt/paged_attention_ops.py:
query_metadata, context_slots) from the runner's host block table, and sends it in one
host-to-device copy (where the kernel's blocks are not the KV cache manager's, the context
slots are computed on the device from vLLM's kernel block table instead). Each layer then
runs two programs (csrc/ops/paged_attention.c):
tpu::reshape_and_cache writes the new keys and values into the cache in place (a row scatter
into the donated cache buffer), and tpu::paged_attention_into gathers every request's context
and computes softmax(QK^T * scale) V in float32 for all requests at once into the output
buffer (causal, optional sliding window and tanh soft cap, grouped-query heads shared as
Hugging Face's repeat_kv shares them). A step whose decodes would be padded to a long prefill
chunk's width runs the decodes and the rest as two grids (two calls into one output)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadata,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.kv_cache_layout import KVCacheLayout

from torch_pjrt import paged_attention_ops as pa


class TpuPagedAttentionBackend(AttentionBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float16", "bfloat16", "float32"]
    forward_includes_kv_cache_update: bool = True

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type[TpuPagedAttentionImpl]:
        return TpuPagedAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[TpuPagedAttentionMetadataBuilder]:
        return TpuPagedAttentionMetadataBuilder

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        return (KVCacheLayout.LBNHC,)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER


@dataclass
class PagedGrid:
    """One paged_attention call's metadata: a group of requests as an [R, Q] grid."""
    context_slots: torch.Tensor  # [R, S] int64: cache slots of each request's positions 0..S-1
    query_index: torch.Tensor  # [R, Q] int64: token of each (request, query row); 0 for padding
    query_pos: torch.Tensor  # [R, Q] int64: position of that query in its request; -1: padding
    output_index: torch.Tensor  # [T] int64: row r*Q + j of each token; -1: another grid's


@dataclass
class TpuPagedAttentionMetadata(AttentionMetadata):
    num_actual_tokens: int
    slot_mapping: torch.Tensor  # [T] int: where each new token's key and value go (-1: none)
    grids: list[PagedGrid]  # one, or two (decodes, then the rest) filling one output
    # The fixed decode layout (step_capture.py): T is the step's padded token count, one grid
    # of T rows of one query each over S context slots (a bucket of the batch's longest
    # context), every tensor a view of a buffer kept for that (T, S) (refilled in place each
    # step, so a captured step reads it). (T, S) here; None for any other layout.
    fixed: tuple[int, int] | None = None


# A decode step in the fixed layout pads every request's context to the same number of slots:
# the smallest of MIN_DECODE_CONTEXT * 2^i (rounded up to whole blocks) that holds the batch's
# longest context, at most the model's length. Each width is its own captured program; the slot
# table a step uploads (N x S int64) then grows with the contexts being served, not with the
# model's length (256 requests at S = 131072 would be 268 MB per step).
MIN_DECODE_CONTEXT = 512


def context_bucket(longest: int, block_size: int, max_positions: int) -> int:
    s = -(-MIN_DECODE_CONTEXT // block_size) * block_size
    while s < longest:
        s *= 2
    return min(s, max_positions)


class TpuPagedAttentionMetadataBuilder(AttentionMetadataBuilder[TpuPagedAttentionMetadata]):
    reorder_batch_threshold: int | None = None  # mixed batches in any order

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size
        # Set by the model runner (model_runner.py) unless the kernel's blocks differ from the
        # KV cache manager's: a callable returning the host (numpy) block table of this
        # builder's KV cache group. Then all metadata is computed on the host.
        self.host_block_table = None
        # Set by the model runner when compiled: its token padding table (token count ->
        # bucket). Decode steps then get the fixed layout (build_fixed_decode).
        self.decode_padding = None
        self.max_positions = -(-vllm_config.model_config.max_model_len // self.block_size) \
            * self.block_size
        self._fixed_buffers: dict[tuple[int, int], torch.Tensor] = {}  # (N, S) -> buffer
        # Set by the runner while it captures steps at engine start: the context width every
        # fixed-layout step gets (one of decode_context_buckets()), whatever its contexts.
        self.decode_context: int | None = None

    def decode_context_buckets(self) -> list[int]:
        """Every context width a fixed-layout decode step can get (context_bucket)."""
        widths = [context_bucket(1, self.block_size, self.max_positions)]
        while widths[-1] < self.max_positions:
            widths.append(context_bucket(widths[-1] + 1, self.block_size, self.max_positions))
        return widths

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> TpuPagedAttentionMetadata:
        cm = common_attn_metadata
        R, T, bs = cm.num_reqs, cm.num_actual_tokens, self.block_size
        qsl = cm.query_start_loc_cpu[: R + 1].numpy()
        host_seq_lens = cm.seq_lens_cpu_upper_bound
        host_blocks = None
        if self.host_block_table is not None and host_seq_lens is not None:
            # exact: vLLM's upper bound differs only with asynchronous speculative decoding,
            # which this platform does not run (platform.py)
            seq_lens = host_seq_lens[:R].numpy()
            host_blocks = self.host_block_table()[:R]
        else:
            seq_lens = cm.seq_lens[:R].cpu().numpy()  # exact context lengths (a sync)
        if (host_blocks is not None and self.decode_padding is not None and T == R
                and 0 < R < len(self.decode_padding)):
            return self.build_fixed_decode(cm, seq_lens, host_blocks)
        blocks = cm.block_table_tensor[:R]
        parts, host = [], []
        for sel in pa.split_requests(qsl[1:] - qsl[:-1]):
            qi, qp, oi, S = pa.query_metadata(qsl, seq_lens, bs, sel)
            if host_blocks is not None:
                rows = host_blocks if sel is None else host_blocks[sel]
                host.append(pa.context_slots(rows, qi.shape[0], S, bs).ravel())
                parts.append((None, S, qi.shape, oi.size))
            else:
                if sel is not None:  # this group's rows of the block table
                    first, n = int(sel[0]), len(sel)
                    rows = (blocks[first:first + n] if sel[-1] - first == n - 1
                            else blocks[torch.from_numpy(sel).to(blocks.device)])
                else:
                    rows = blocks
                parts.append((pa.context_slots(rows, qi.shape[0], S, bs), S, qi.shape, oi.size))
            host += [qi.ravel(), qp.ravel(), oi]
        # the host-computed metadata of every grid in one host-to-device copy
        packed = torch.from_numpy(np.concatenate(host)).to(self.device)
        grids, at = [], 0

        def take(n):
            nonlocal at
            at += n
            return packed[at - n:at]

        for cs, S, shape, t in parts:
            if cs is None:  # computed on the host: [R', S] (R' = the grid's rows)
                cs = take(shape[0] * S).view(shape[0], S)
            n = shape[0] * shape[1]
            grids.append(PagedGrid(cs, take(n).view(shape), take(n).view(shape), take(t)))
        return TpuPagedAttentionMetadata(num_actual_tokens=T, slot_mapping=cm.slot_mapping[:T],
                                         grids=grids)

    def build_fixed_decode(self, cm: CommonAttentionMetadata, seq_lens: np.ndarray,
                           host_blocks: np.ndarray) -> TpuPagedAttentionMetadata:
        """A decode step (R requests, one new token each) padded to its token bucket N: one
        grid of N rows over S context slots, S the bucket of the longest context
        (context_bucket; the kernel reads each row's own positions only: the rest is never
        touched), rows past R padding (query_pos -1: zeros out). The four arrays go into this
        (N, S)'s buffer by one whole-buffer copy (a transfer into the same storage: what a
        captured step reads)."""
        R, bs = cm.num_reqs, self.block_size
        S = context_bucket(int(seq_lens[:R].max()), bs, self.max_positions)
        if self.decode_context is not None:  # capturing: the width asked for (contexts fit)
            S = max(S, self.decode_context)
        N = self.decode_padding[R]
        cs = pa.context_slots(host_blocks, N, S, bs)
        qi = np.zeros(N, np.int64)
        qi[:R] = np.arange(R)
        qp = np.full(N, -1, np.int64)
        qp[:R] = seq_lens[:R] - 1
        host = torch.from_numpy(np.concatenate([cs.ravel(), qi, qp, np.arange(N)]))
        buf = self._fixed_buffers.get((N, S))
        if buf is None:
            buf = self._fixed_buffers[N, S] = torch.zeros_like(host, device=self.device)
        buf.copy_(host)
        grid = PagedGrid(buf[:N * S].view(N, S), buf[N * S:N * S + N].view(N, 1),
                         buf[N * S + N:N * S + 2 * N].view(N, 1), buf[N * S + 2 * N:])
        # vLLM slices the slot mapping to its own padded count, which can be less than the
        # runner's bucket: N entries of the same buffer (compute_slot_mapping in
        # model_runner.py fills everything past the real tokens with PAD_SLOT_ID)
        sm = cm.slot_mapping
        sm = torch.as_strided(sm, (N,), (1,), sm.storage_offset())
        return TpuPagedAttentionMetadata(num_actual_tokens=N, slot_mapping=sm, grids=[grid],
                                         fixed=(N, S))


class TpuPagedAttentionImpl(AttentionImpl[TpuPagedAttentionMetadata]):
    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, alibi_slopes=None,
                 sliding_window=None, kv_cache_dtype="auto", logits_soft_cap=None,
                 attn_type=AttentionType.DECODER, kv_sharing_target_layer_name=None, **kwargs):
        unsupported = {"alibi_slopes": alibi_slopes,
                       "kv_sharing_target_layer_name": kv_sharing_target_layer_name}
        for name, value in unsupported.items():
            if value is not None:
                raise NotImplementedError(f"tpu attention: {name} is not implemented")
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"tpu attention: {attn_type} attention is not implemented")
        if kv_cache_dtype not in ("auto", "float16", "bfloat16", "float32"):
            raise NotImplementedError(f"tpu attention: kv cache dtype {kv_cache_dtype}")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        # vLLM's window: a query at position p sees keys at p - sliding_window + 1 .. p
        self.sliding_window = int(sliding_window) if sliding_window else -1
        self.logits_soft_cap = float(logits_soft_cap) if logits_soft_cap else 0.0
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        if num_heads % self.num_kv_heads != 0:
            raise ValueError(f"tpu attention: {num_heads} query heads are not a multiple of "
                             f"{self.num_kv_heads} kv heads")

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("tpu attention: fused output quantization")
        if attn_metadata is None:  # profiling run: no cache yet
            return output.zero_()
        md = attn_metadata
        T, H, Hkv, D = md.num_actual_tokens, self.num_heads, self.num_kv_heads, self.head_size
        # The physical [blocks, block_size, kv heads, 2D] cache: the whole storage, so the
        # write below donates its buffer and updates only the written rows.
        cache = kv_cache.transpose(1, 2)
        torch.ops.tpu.reshape_and_cache(cache, key[:T].view(T, Hkv, D),
                                        value[:T].view(T, Hkv, D), md.slot_mapping)
        out, q = output[:T].view(T, H, D), query[:T].view(T, H, D)
        for g in md.grids:  # each writes its requests' rows of out
            torch.ops.tpu.paged_attention_into(
                out, q, cache, g.context_slots, g.query_index, g.query_pos, g.output_index,
                self.scale, self.logits_soft_cap, self.sliding_window)
        return output
