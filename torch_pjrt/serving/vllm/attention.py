"""Paged attention for vLLM in plain torch ops, run on the `tpu` device.

Correct and simple first (a later step fuses a layer's attention into one program). The KV
cache of a layer is one tensor, physically [num_blocks, block_size, num_kv_heads, 2*head_size]
(vLLM's LBNHC layout: keys in the first head_size channels, values in the rest), which vLLM
hands to forward() as its logical [num_blocks, num_kv_heads, block_size, 2*head_size] view.
A token's slot is block * block_size + offset, so the cache flattens to [slots, heads, 2*hd].

One step's batch may mix prefills, chunked prefills and decodes. The metadata builder does
the per-step bookkeeping once on the host (numpy), for all layers: the cache slots of each
request's context, its queries padded to the batch's longest query, and the causal mask
(query at position p sees keys at positions <= p of its own request). Each layer then writes
its new keys and values into the cache and computes softmax(QK^T * scale) V per request in
float32 with grouped-query heads shared as Hugging Face's repeat_kv shares them."""

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
class TpuPagedAttentionMetadata(AttentionMetadata):
    num_actual_tokens: int
    slot_mapping: torch.Tensor  # [T] int64: where each new token's key and value go
    context_slots: torch.Tensor  # [R, S] int64: cache slots of each request's positions 0..S-1
    query_index: torch.Tensor  # [R, Q] int64: token of each (request, query row); 0 for padding
    mask: torch.Tensor  # [R, Q, S] bool: which context positions a query row sees
    output_index: torch.Tensor  # [T] int64: row r*Q + j of each token in the padded output


class TpuPagedAttentionMetadataBuilder(AttentionMetadataBuilder[TpuPagedAttentionMetadata]):
    reorder_batch_threshold: int | None = None  # mixed batches in any order

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> TpuPagedAttentionMetadata:
        cm = common_attn_metadata
        R, T, bs = cm.num_reqs, cm.num_actual_tokens, self.block_size
        qsl = cm.query_start_loc_cpu[: R + 1].numpy().astype(np.int64)
        seq_lens = cm.seq_lens[:R].cpu().numpy().astype(np.int64)  # exact context lengths
        q_lens = qsl[1:] - qsl[:-1]
        Q = max(int(q_lens.max()) if R else 1, 1)
        S = max(int(seq_lens.max()) if R else 1, 1)
        nblk = -(-S // bs)

        rows = np.arange(Q)
        valid_q = rows[None, :] < q_lens[:, None]  # [R, Q]
        query_index = np.where(valid_q, qsl[:-1, None] + rows[None, :], 0)
        # Position of query row j of request r: its context before this step plus j.
        q_pos = (seq_lens - q_lens)[:, None] + rows[None, :]
        k_pos = np.arange(S)
        mask = k_pos[None, None, :] <= q_pos[:, :, None]
        mask[~valid_q] = False
        mask[..., 0] |= ~valid_q  # padding rows see one key: no all-masked softmax rows
        tok = np.arange(T)
        tok_req = np.searchsorted(qsl[1:], tok, side="right")
        output_index = tok_req * Q + (tok - qsl[tok_req])

        dev = self.device
        blocks = cm.block_table_tensor[:R, :nblk].to(torch.int64)  # on the device
        k_pos_t = torch.arange(S, dtype=torch.int64)
        context_slots = (blocks[:, (k_pos_t // bs).to(dev)] * bs + (k_pos_t % bs).to(dev))
        return TpuPagedAttentionMetadata(
            num_actual_tokens=T,
            slot_mapping=cm.slot_mapping[:T].to(torch.int64),
            context_slots=context_slots,
            query_index=torch.from_numpy(query_index).to(dev),
            mask=torch.from_numpy(mask).to(dev),
            output_index=torch.from_numpy(output_index).to(dev),
        )


class TpuPagedAttentionImpl(AttentionImpl[TpuPagedAttentionMetadata]):
    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, alibi_slopes=None,
                 sliding_window=None, kv_cache_dtype="auto", logits_soft_cap=None,
                 attn_type=AttentionType.DECODER, kv_sharing_target_layer_name=None, **kwargs):
        unsupported = {"alibi_slopes": alibi_slopes, "sliding_window": sliding_window,
                       "logits_soft_cap": logits_soft_cap,
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
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        assert num_heads % self.num_kv_heads == 0
        self.group = num_heads // self.num_kv_heads

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("tpu attention: fused output quantization")
        if attn_metadata is None:  # profiling run: no cache yet
            return output.zero_()
        md = attn_metadata
        T, H, Hkv, D = md.num_actual_tokens, self.num_heads, self.num_kv_heads, self.head_size
        # [B, H, N, C] logical view of the physical [B, N, H, C] cache -> [slots, H, C] view.
        flat = kv_cache.transpose(1, 2).view(-1, Hkv, 2 * D)
        k = key[:T].view(T, Hkv, D)
        v = value[:T].view(T, Hkv, D)
        flat[md.slot_mapping] = torch.cat([k, v], dim=-1).to(flat.dtype)

        R, S = md.context_slots.shape
        Qr = md.query_index.shape[1]
        ctx = flat[md.context_slots]  # [R, S, Hkv, 2D]
        keys = ctx[..., :D].unsqueeze(3).expand(R, S, Hkv, self.group, D).reshape(R, S, H, D)
        vals = ctx[..., D:].unsqueeze(3).expand(R, S, Hkv, self.group, D).reshape(R, S, H, D)
        q = query[:T].view(T, H, D)[md.query_index]  # [R, Q, H, D]
        scores = torch.einsum("rqhd,rshd->rhqs", q.float(), keys.float()) * self.scale
        scores = scores.masked_fill(~md.mask.unsqueeze(1), float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.einsum("rhqs,rshd->rqhd", probs, vals.float()).reshape(R * Qr, H, D)
        output[:T].view(T, H, D).copy_(out[md.output_index].to(output.dtype))
        return output
