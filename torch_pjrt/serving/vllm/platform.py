"""vLLM's Platform for torch_pjrt's `tpu` device (an out-of-tree platform, PrivateUse1).

Compiled steps by default: vLLM's piecewise compilation (CompilationMode.VLLM_COMPILE) with
torch_pjrt's backend behind vLLM's compiler interface (compiler.py); the graph is split at the
attention ops, which run eagerly through attention.py (two fused programs per layer).
`enforce_eager=True` (`--enforce-eager`) runs every aten op as its own program (strict mode)
instead. No CUDA graphs in either mode. Tensor parallelism runs one process per rank (vLLM's
multiprocess executor, spawned) with collectives on tpu tensors over torch_pjrt's `tpu_dist`
backend (docs/serving-tp.md)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)

_PKG = "torch_pjrt.serving.vllm"


def token_buckets(max_tokens: int) -> list[int]:
    """Token counts a compiled step is padded up to: powers of two, and the step budget itself
    (at most 2x padding, about log2(budget) programs per graph piece)."""
    sizes, n = [], 1
    while n < max_tokens:
        sizes.append(n)
        n *= 2
    sizes.append(max_tokens)
    return sizes


class TpuPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "tpu"
    device_type: str = "tpu"
    dispatch_key: str = "PrivateUse1"
    # vLLM's device groups (each GroupCoordinator's, and the default group): tpu_dist alone, as
    # CUDA's are NCCL alone; vLLM sends CPU tensors over the Gloo CPU group it makes beside each.
    dist_backend: str = "tpu_dist"
    # torch.compile of vLLM's small helper functions: ours, never inductor's CUDA/C++ codegen.
    simple_compile_backend: str = "tpu"
    device_control_env_var: str = "TORCH_PJRT_VISIBLE_DEVICES"

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return f"{_PKG}.communicator.TpuCommunicator"

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        if dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"tpu: model dtype {dtype} is not supported")

    @classmethod
    def import_kernels(cls) -> None:
        pass  # no vllm._C: every op is an aten op lowered by torch_pjrt

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        if getattr(attn_selector_config, "use_mla", False):
            raise NotImplementedError("tpu: MLA attention is not implemented")
        return f"{_PKG}.attention.TpuPagedAttentionBackend"

    @classmethod
    def get_compile_backend(cls) -> str:
        """vLLM's piecewise compilation resolves this to a CompilerInterface (compiler.py)."""
        return f"{_PKG}.compiler.TpuCompilerAdaptor"

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return torch.tpu.get_device_name(device_id)

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return torch.tpu.get_device_properties(device_id).total_memory

    @classmethod
    def device_count(cls) -> int:
        return torch.tpu.device_count()

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.tpu.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.tpu.manual_seed_all(seed)

    @classmethod
    def inference_mode(cls):
        return torch.no_grad()

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def get_current_memory_usage(cls, device=None) -> float:
        return float(torch.tpu.memory_allocated(device))

    @classmethod
    def support_static_graph_mode(cls) -> bool:
        return False

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return False

    @classmethod
    def check_runner_kv_caches_multi_layer(cls) -> None:
        # Several attention layers at one layer index (a draft model's beside the target's,
        # cross- and self-attention) put several caches at one place of the runner's kv_caches
        # list; this runner only walks that list whole (model_runner._zero_block_ids), so the
        # order does not matter (CUDA's and CPU's platforms say the same).
        pass

    @classmethod
    def opaque_attention_op(cls) -> bool:
        # Attention layers call the registered op torch.ops.vllm.unified_attention_with_output,
        # which Dynamo keeps as one opaque node: vLLM's piecewise compilation splits the graph
        # there and runs attention eagerly between the compiled pieces. (A direct call would
        # let Dynamo trace into attention.py, baking one step's metadata into the graph.)
        return True

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        from vllm.config import CompilationMode, CUDAGraphMode

        parallel = vllm_config.parallel_config
        if parallel.worker_cls == "auto":
            parallel.worker_cls = f"{_PKG}.worker.TpuWorker"
        if parallel.data_parallel_size > 1:
            raise NotImplementedError("tpu: data parallel serving is not implemented")
        if parallel.distributed_executor_backend in (None, "auto"):
            # One process per rank: each has its own PJRT client (docs/serving-tp.md).
            parallel.distributed_executor_backend = "mp" if parallel.world_size > 1 else "uni"

        comp = vllm_config.compilation_config
        model = vllm_config.model_config
        compiled = (model is not None and not model.enforce_eager
                    and comp.mode == CompilationMode.VLLM_COMPILE)
        # No CUDA graphs either way: the compiled pieces are already one program each.
        comp.cudagraph_mode = CUDAGraphMode.NONE
        if compiled:
            comp.backend = cls.get_compile_backend()
            # The runner pads each step's token count up to one of these sizes the way vLLM
            # pads for CUDA graphs (the dispatcher's size table over cudagraph_capture_sizes),
            # so a server runs a bounded set of programs, all compiled at engine start.
            sizes = token_buckets(vllm_config.scheduler_config.max_num_batched_tokens)
            comp.cudagraph_capture_sizes = sizes
            comp.max_cudagraph_capture_size = sizes[-1]
            # every size is covered by vLLM's one symbolic compile (the backend specializes
            # per size itself), so no per-size compiles
            comp.compile_sizes = []
            # vLLM's fusion passes are Inductor post-grad passes that rewrite graphs into CUDA
            # and ROCm custom ops; torch_pjrt's backend runs no Inductor passes, has no such ops.
            passes = comp.pass_config
            for name in list(vars(passes)):
                if name.startswith(("fuse_", "enable_")) and getattr(passes, name):
                    setattr(passes, name, False)
        else:
            comp.mode = CompilationMode.NONE
            comp.cudagraph_capture_sizes = []
            if hasattr(comp, "max_cudagraph_capture_size"):
                comp.max_cudagraph_capture_size = 0
            if model is not None:
                model.enforce_eager = True

        # vLLM starts its engine core (and multiprocess workers) with fork by default; a forked
        # child cannot use the parent's PJRT client, so spawn unless the user chose otherwise.
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        # vLLM's "mega" AOT artifact stores each compiled piece as an Inductor artifact and
        # reloads it as one, which fails for this backend's pieces ("a bytes-like object is
        # required, not 'BundledAOTAutogradResult'"), so every restart warned and traced the
        # model with Dynamo again. Without it vLLM saves the AOT-compiled forward and reloads
        # the pieces through TpuCompilerAdaptor.load.
        os.environ.setdefault("VLLM_USE_MEGA_AOT_ARTIFACT", "0")

        cache = vllm_config.cache_config
        if cache.block_size is None:
            cache.block_size = 16
        # The runner's async output copies use CUDA streams; tpu steps are synchronous for now.
        if getattr(vllm_config.scheduler_config, "async_scheduling", False):
            logger.info("tpu: async scheduling off (not implemented on this platform)")
            vllm_config.scheduler_config.async_scheduling = False
