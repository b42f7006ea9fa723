"""vLLM's V1 GPUModelRunner on the `tpu` device.

What differs from CUDA: stream and event objects are torch_pjrt's; the KV cache is one dense
tensor per layer (not vLLM's one shared int8 allocation with per-layer views: a write into a
view of a shared storage would rewrite the whole shared buffer on an XLA device); the Triton
kernels the V1 runner launches are replaced: slot mapping is computed on the host (numpy) and
copied once, KV block zeroing is a torch op."""

from __future__ import annotations

import dataclasses
import functools
import weakref
from contextlib import contextmanager

import numpy as np
import torch
from vllm.logger import init_logger
from vllm.v1.kv_cache_interface import AttentionSpec, UniformTypeKVCacheSpecs
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.utils import bind_kv_cache, map_kv_caches_to_kernel_blocks

logger = init_logger(__name__)

PAD_SLOT_ID = -1  # vLLM's marker of a token that writes no cache slot


@contextmanager
def _tpu_streams_as_cuda():
    """The runner names torch.cuda.Stream/Event; on tpu they are torch_pjrt's."""
    saved = (torch.cuda.Stream, torch.cuda.Event)
    torch.cuda.Stream = torch.tpu.Stream

    def event(*args, blocking=None, external=None, **kwargs):
        return torch.tpu.Event(*args, **kwargs)

    torch.cuda.Event = event
    try:
        yield
    finally:
        torch.cuda.Stream, torch.cuda.Event = saved


def compute_slot_mapping(block_table, num_reqs: int, query_start_loc: torch.Tensor,
                         positions: torch.Tensor, runner) -> None:
    """Stands in for vLLM's Triton slot-mapping kernel (no context parallelism): the cache
    slot of token t of request r at position p is block_table[r, p // bs] * bs + p % bs;
    the rest of the buffer gets PAD_SLOT_ID. Computed on the host from the runner's numpy
    state (exact: no asynchronous scheduling on this platform) and sent as one copy of the
    whole buffer (a transfer, no program), instead of a dozen small device ops."""
    if getattr(block_table, "dcp_world_size", 1) != 1:
        raise NotImplementedError("tpu: decode context parallelism")
    from vllm.v1.worker.block_table import SlotMappingMode

    if block_table.slot_mapping_mode == SlotMappingMode.NONE:
        return
    from torch_pjrt.paged_attention_ops import slot_mapping

    n = positions.shape[0]
    qsl = runner.query_start_loc.np[: num_reqs + 1]
    # context lengths after the step: the device's positions end there
    seq_lens = runner.input_batch.num_computed_tokens_cpu[:num_reqs] + np.diff(qsl)
    sm = block_table.slot_mapping
    sm.np[:n] = slot_mapping(qsl, seq_lens, block_table.block_table.np[:num_reqs],
                             block_table.block_size)
    sm.np[n:] = PAD_SLOT_ID
    sm.copy_to_gpu()


def _host_block_table(runner, gid: int) -> np.ndarray:
    # looked up at every step: the runner may replace its input batch
    return runner.input_batch.block_table[gid].block_table.np


class TpuModelRunner(GPUModelRunner):
    def __init__(self, vllm_config, device: torch.device):
        with _tpu_streams_as_cuda():
            super().__init__(vllm_config, device)
        if self.use_async_spec_decode:  # platform.py turns asynchronous scheduling off
            raise NotImplementedError("tpu: asynchronous speculative decoding")
        self._use_torch_slot_mapping()
        self._host_resident_index_buffers()
        self._pad_to = self._token_padding()
        self._step_runners: dict = {}  # (tokens, metadata layout) -> step_capture.StepRunner
        # Decode steps are captured whole when compiled on one rank: a model split over ranks
        # runs its collectives through tpu_dist's host path, which a capture cannot hold.
        self._capture_steps = (self._pad_to is not None
                               and self.parallel_config.world_size == 1)

    def _host_resident_index_buffers(self) -> None:
        """Keeps on the host the runner's buffers that only feed its device arithmetic of
        positions and context lengths (`_prepare_inputs`: positions = num_computed_tokens
        [req_indices] + query_pos, seq_lens = num_computed_tokens + num_scheduled_tokens):
        with their device sides being their host tensors, that arithmetic runs as CPU ops
        and its results reach the device as one upload each, instead of four partial uploads
        and six small programs per step (a partial upload is a transfer and a program here).
        Only vLLM's decode-context-parallel and asynchronous speculative-decoding paths use
        these buffers otherwise; neither runs on this platform.

        Two more: `seq_lens` (its device side feeds only the attention metadata, which this
        platform's builder computes from the host's lengths) and `num_accepted_tokens` (read
        on the device only by hybrid models' linear-attention builders, which this platform
        does not run): each step filled and uploaded them, a program and a partial upload."""
        self.num_computed_tokens = torch.zeros_like(self.num_computed_tokens, device="cpu")
        self.seq_lens = torch.zeros_like(self.seq_lens, device="cpu")
        for buf in (self.req_indices, self.query_pos, self.num_scheduled_tokens,
                    self.num_accepted_tokens):
            buf.gpu = buf.cpu  # copy_to_gpu is then a copy of the buffer onto itself

    def _token_padding(self) -> list[int] | None:
        """Compiled steps: token count -> padded count, vLLM's CUDA-graph table
        (cudagraph_dispatcher) over the buckets platform.py put in cudagraph_capture_sizes.
        None when eager (no padding: every op is its own program anyway)."""
        from vllm.config import CompilationMode

        comp = self.compilation_config
        if comp.mode != CompilationMode.VLLM_COMPILE or not comp.cudagraph_capture_sizes:
            return None
        self.cudagraph_dispatcher._compute_bs_to_padded_graph_size()
        return list(self.cudagraph_dispatcher._bs_to_padded_graph_size)

    def _determine_batch_execution_and_padding(self, num_tokens, *args, **kwargs):
        mode, desc, ubatch, across_dp, stats = super()._determine_batch_execution_and_padding(
            num_tokens, *args, **kwargs)
        pad_to = self._pad_to
        if pad_to is not None and desc.num_tokens < len(pad_to):
            # The padded tokens are computed and ignored: attention reads only the real
            # tokens (its metadata counts them) and their slot mapping is PAD_SLOT_ID.
            desc = dataclasses.replace(desc, num_tokens=pad_to[desc.num_tokens])
        return mode, desc, ubatch, across_dp, stats

    def _model_forward(self, input_ids=None, positions=None, intermediate_tensors=None,
                       inputs_embeds=None, **model_kwargs):
        return self._step_forward(self.model, input_ids=input_ids, positions=positions,
                                  intermediate_tensors=intermediate_tensors,
                                  inputs_embeds=inputs_embeds, **model_kwargs)

    def _step_forward(self, model, input_ids=None, positions=None, intermediate_tensors=None,
                      inputs_embeds=None, **model_kwargs):
        """model(...) as vLLM calls it, except that a decode step with its attention metadata
        in the fixed layout runs as one captured program (step_capture.py)."""
        from torch_pjrt.serving.vllm import step_capture

        layout = step_capture.fixed_decode_step() if self._capture_steps else None
        if (layout is None or input_ids is None or positions is None
                or intermediate_tensors is not None or inputs_embeds is not None
                or model_kwargs):
            return model(input_ids=input_ids, positions=positions,
                         intermediate_tensors=intermediate_tensors, inputs_embeds=inputs_embeds,
                         **model_kwargs)
        return step_capture.run(self._step_runners, layout,
                                lambda ids, pos: model(input_ids=ids, positions=pos),
                                input_ids, positions)

    def capture_decode_steps(self) -> None:
        """Captures (compiles, or loads from the disk cache) the decode step of every token
        bucket a decode batch can pad to at every context width (attention.context_bucket),
        with dummy decode batches, so that no request waits for one. vLLM's dummy run calls
        self.model directly: it is routed through _step_forward meanwhile, and the builders
        are told the width to lay each one out at. The dummy tokens write their keys and
        values into slot 0, the KV cache manager's null block, which no request reads."""
        if not self._capture_steps:
            return
        from torch_pjrt.serving.vllm.attention import TpuPagedAttentionMetadataBuilder

        model, runner = self.model, self

        class Routed:
            def __call__(self, *args, **kwargs):
                return runner._step_forward(model, *args, **kwargs)

            def __getattr__(self, name):
                return getattr(model, name)

        smallest = {}  # bucket -> the fewest requests that pad to it
        for reqs in range(min(self.max_num_reqs, len(self._pad_to) - 1), 0, -1):
            smallest[self._pad_to[reqs]] = reqs
        builders = [b for groups in self.attn_groups for g in groups for b in g.metadata_builders
                    if isinstance(b, TpuPagedAttentionMetadataBuilder)
                    and b.decode_padding is not None]
        widths = sorted({w for b in builders for w in b.decode_context_buckets()})
        self.model = Routed()
        try:
            for width in widths:
                for b in builders:
                    b.decode_context = min(width, b.max_positions)
                for bucket, reqs in sorted(smallest.items(), reverse=True):
                    logger.info("tpu: capturing the decode step of %d tokens over %d context "
                                "slots", bucket, width)
                    self._dummy_run(reqs, force_attention=True, uniform_decode=True,
                                    skip_eplb=True, remove_lora=False)
        finally:
            self.model = model
            for b in builders:
                b.decode_context = None

    def load_model(self, *args, **kwargs) -> None:
        super().load_model(*args, **kwargs)
        self._column_major_linear_weights()

    def _column_major_linear_weights(self) -> None:
        """Stores every unquantized linear weight [out, in] column-major (the transposed view
        of a contiguous [in, out] buffer), the LM head's too. F.linear(x, W) multiplies by W^T,
        which is then a contiguous matrix; XLA's CPU dot is much slower with the row-major W
        (contracting its minor dim): one [1, 768] x [768, 2048] product took 0.99 ms row-major
        and 0.11 ms column-major (0.52 vs 0.20 ms for 8 rows; equal from 64 rows), a
        [1, 768] x [768, 32000] LM head 13.8 vs 4.3 ms, and decode steps are such products.
        A tied input embedding reads the same column-major buffer: a row lookup in it cost
        the same as in the row-major one (0.13 ms for 4 rows of 32000 x 768)."""
        from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            ParallelLMHead,
            UnquantizedEmbeddingMethod,
        )

        for m in self.get_model().modules():
            method = getattr(m, "quant_method", None)
            if not ((isinstance(m, LinearBase) and isinstance(method, UnquantizedLinearMethod))
                    or (isinstance(m, ParallelLMHead)
                        and isinstance(method, UnquantizedEmbeddingMethod))):
                continue
            w = getattr(m, "weight", None)
            if isinstance(w, torch.Tensor) and w.dim() == 2 and w.is_contiguous():
                # same Parameter object (the model and vLLM keep references to it); a weight
                # shared by two modules is converted once (then no longer contiguous)
                w.data = w.data.t().contiguous().t()

    def token_buckets(self) -> list[int]:
        return list(self.compilation_config.cudagraph_capture_sizes or [])

    def _use_torch_slot_mapping(self) -> None:
        # a weak reference: the input batch (holding these methods) is the runner's
        runner = weakref.proxy(self)
        for bt in self.input_batch.block_table.block_tables:
            bt.compute_slot_mapping = functools.partial(compute_slot_mapping, bt, runner=runner)

    def initialize_metadata_builders(self, kv_cache_config, kernel_block_sizes) -> None:
        """vLLM's builders; ours also get the host block table of their KV cache group (when
        its blocks are the kernel's), so that every step's attention metadata is computed on
        the host (attention.py)."""
        super().initialize_metadata_builders(kv_cache_config, kernel_block_sizes)
        from torch_pjrt.serving.vllm.attention import TpuPagedAttentionMetadataBuilder

        for gid, groups in enumerate(self.attn_groups):
            for group in groups:
                if group.kernel_block_size is not None:
                    continue
                for b in group.metadata_builders:
                    if isinstance(b, TpuPagedAttentionMetadataBuilder):
                        b.host_block_table = functools.partial(
                            _host_block_table, weakref.proxy(self), gid)
                        # compiled: decode steps get the fixed layout step_capture.py needs
                        if self._capture_steps:
                            b.decode_padding = self._pad_to

    def may_reinitialize_input_batch(self, kv_cache_config) -> None:
        super().may_reinitialize_input_batch(kv_cache_config)
        self._use_torch_slot_mapping()

    def initialize_kv_cache_tensors(self, kv_cache_config, kernel_block_sizes,
                                    kv_cache_allocation_context=None):
        """One zeroed tensor per layer, physically [blocks, block_size, kv_heads, 2*head_size],
        bound as its [blocks, kv_heads, block_size, 2*head_size] view (vLLM's LBNHC)."""
        kv_caches: dict[str, torch.Tensor] = {}
        for tensor in kv_cache_config.kv_cache_tensors:
            for layer in tensor.layers:
                group = next(g for g in kv_cache_config.kv_cache_groups
                             if layer in g.layer_names)
                spec = group.kv_cache_spec
                if isinstance(spec, UniformTypeKVCacheSpecs):
                    spec = spec.kv_cache_specs[layer]
                if not isinstance(spec, AttentionSpec) or spec.head_size_v != spec.head_size:
                    raise NotImplementedError(f"tpu: KV cache spec {type(spec).__name__}")
                num_blocks = kv_cache_config.num_blocks_of(tensor)
                phys = torch.zeros(num_blocks, spec.block_size, spec.num_kv_heads,
                                   2 * spec.head_size, dtype=spec.dtype, device=self.device)
                kv_caches[layer] = phys.permute(0, 2, 1, 3)
        for layer, target in self.shared_kv_cache_layers.items():
            kv_caches[layer] = kv_caches[target]
        attn_groups = [g for groups in self.attn_groups for g in groups]
        bind_kv_cache(kv_caches, self.compilation_config.static_forward_context,
                      self.kv_caches, 1, kv_cache_groups=kv_cache_config.kv_cache_groups,
                      layer_kv_caches=map_kv_caches_to_kernel_blocks(kv_caches, attn_groups))
        return kv_caches

    def _init_kv_zero_meta(self) -> None:
        pass  # vLLM's zeroer is a Triton kernel over raw addresses; _zero_block_ids is torch

    def _zero_block_ids(self, block_ids: list[int]) -> None:
        if not block_ids:
            return
        idx = torch.tensor(block_ids, dtype=torch.int64, device=self.device)
        for kv in {id(t): t for t in self.kv_caches}.values():
            kv[idx] = 0

    def _sync_device(self) -> None:
        torch.tpu.synchronize(self.device)

    def _to_list(self, sampled_token_ids: torch.Tensor) -> list[list[int]]:
        return sampled_token_ids.cpu().tolist()
