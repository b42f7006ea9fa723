"""vLLM worker on the `tpu` device: vLLM's GPU worker with the device, memory and model runner
parts replaced (no CUDA memory pools, no CUDA graphs, no Triton)."""

from __future__ import annotations

from contextlib import nullcontext

import torch
from vllm.distributed.parallel_state import get_pp_group
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.worker_base import CompilationTimes

from torch_pjrt.distributed import local_device

logger = init_logger(__name__)


class TpuWorker(Worker):
    def init_device(self):
        if self.use_v2_model_runner:
            raise NotImplementedError("tpu: only vLLM's V1 model runner is supported "
                                      "(set VLLM_USE_V2_MODEL_RUNNER=0)")
        # tpu:<local rank> when the plugin has several devices, else tpu:0: with one device
        # (the CPU plugin's default) each rank's process has its own client and its own tpu:0.
        self.device = local_device(self.local_rank)
        torch.tpu.set_device(self.device)
        current_platform.check_if_supports_dtype(self.model_config.dtype)
        init_worker_distributed_environment(
            self.vllm_config, self.rank, self.distributed_init_method, self.local_rank,
            current_platform.dist_backend)
        set_random_seed(self.model_config.seed)
        # Speculative decoding's rejection sampler launches Triton kernels: torch versions.
        from .rejection import install as use_torch_rejection_sampler

        use_torch_rejection_sampler()
        self._init_workspace_and_model_runner()

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        super().load_model(load_dummy_weights=load_dummy_weights)
        # A later pipeline stage receives the previous stage's activations into buffers the
        # runner makes in its CUDA warmup (_dummy_run), which this worker skips
        # (compile_or_warm_up_model): make them here, once, as that warmup would.
        runner = self.model_runner
        if not get_pp_group().is_first_rank and runner.intermediate_tensors is None:
            runner.intermediate_tensors = runner.model.make_empty_intermediate_tensors(
                batch_size=runner.max_num_tokens, dtype=self.model_config.dtype,
                device=self.device)

    def _make_model_runner(self):
        from .model_runner import TpuModelRunner

        return TpuModelRunner(self.vllm_config, self.device)

    def _maybe_get_memory_pool_context(self, tag: str):
        return nullcontext()  # vLLM's pools are CUDA's (cumem); tpu tensors use our allocator

    def determine_available_memory(self) -> int:
        """Bytes for the KV cache: --kv-cache-memory-bytes when given, otherwise
        gpu_memory_utilization of the device's memory less what the weights already hold
        (torch.accelerator.get_memory_info; on the CPU plugin that is the host's memory)."""
        explicit = self.cache_config.kv_cache_memory_bytes
        if explicit is not None:
            return int(explicit)
        free, total = torch.accelerator.get_memory_info(self.device)
        used = torch.tpu.memory_allocated(self.device)
        budget = int(total * self.cache_config.gpu_memory_utilization) - used
        avail = min(budget, int(free))
        if avail <= 0:
            raise ValueError(f"tpu: no memory left for the KV cache (free {free}, total {total}, "
                             f"weights {used}); set --kv-cache-memory-bytes")
        logger.info("tpu: %.2f GiB for the KV cache", avail / 2**30)
        return avail

    def compile_or_warm_up_model(self) -> CompilationTimes:
        """Compiled mode: one dummy step at every token bucket (largest first), so that the
        program of every compiled piece at every bucket is compiled (or loaded from the disk
        caches) before the first request, then one dummy decode step at every bucket a decode
        batch pads to and every context width, which captures that step whole
        (model_runner.capture_decode_steps); attention outside those and the sampler stay eager
        ops, compiled at their first use of a shape. Eager mode: nothing (vLLM's warmup runs
        CUDA/Triton kernels; each eager op's program is compiled at first use and kept in
        torch_pjrt's memory and disk caches)."""
        from vllm.config import CompilationMode

        if self.compilation_config.mode == CompilationMode.VLLM_COMPILE:
            for size in sorted(self.model_runner.token_buckets(), reverse=True):
                logger.info("tpu: compiling and warming up the model for %d tokens", size)
                self.model_runner._dummy_run(size, skip_eplb=True, remove_lora=False)
            self.model_runner.capture_decode_steps()
            torch.tpu.synchronize(self.device)
        set_random_seed(self.model_config.seed)
        return CompilationTimes(language_model=self.compilation_config.compilation_time,
                                encoder=self.compilation_config.encoder_compilation_time)

    def sleep(self, level: int = 1) -> None:
        logger.warning("tpu: sleep mode is not supported; ignored")

    def wake_up(self, tags=None) -> None:
        logger.warning("tpu: sleep mode is not supported; ignored")
