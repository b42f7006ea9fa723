"""vLLM's compiler interface over torch_pjrt's `torch.compile(backend="tpu")` backend.

With compilation on (the default; `--enforce-eager` turns it off), vLLM's VllmBackend traces the
model's forward once with Dynamo (the number of tokens symbolic), splits the graph at its
attention ops, and hands every piece between two attention layers to this adaptor. Each piece
goes through torch_pjrt's backend (AOTAutograd, then a GraphRunner): the first call at a
concrete token count captures the piece into one StableHLO program, kept in torch_pjrt's memory
and disk caches; every later call at that count is one PJRT execution. Attention runs between the
pieces through the attention backend (attention.py), outside any compiled program.

The symbolic graph is compiled once for vLLM's whole token range: the GraphRunner specializes per
concrete size itself, so `compile_sizes` are not needed. What keeps the set of programs bounded
is the runner (model_runner.py) padding every step's token count up to a bucket.

Restarts: vLLM keeps this adaptor's handle in its own cache file; `load` builds the piece again
through the backend, which then finds AOTAutograd's result in its AOT cache and every program
in torch_pjrt's disk cache (TORCH_PJRT_CACHE_DIR), so nothing is compiled by XLA again."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import torch
from vllm.compilation.compiler_interface import CompilerInterface
from vllm.logger import init_logger

logger = init_logger(__name__)


class TpuCompilerAdaptor(CompilerInterface):
    name = "torch_pjrt_tpu"

    def initialize_cache(self, cache_dir: str, disable_cache: bool = False,
                         prefix: str = "") -> None:
        """AOTAutograd's cache (the backend's ``aot_cache``, under TORCHINDUCTOR_CACHE_DIR)
        beside vLLM's own files for this model, as vLLM's Inductor adaptor places it; the
        programs stay in torch_pjrt's cache (TORCH_PJRT_CACHE_DIR), shared by every model."""
        if disable_cache:
            return
        base = os.path.dirname(cache_dir) if prefix else cache_dir  # shared by the prefixes
        path = os.path.join(base, "inductor_cache")
        os.makedirs(path, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = path

    def compute_hash(self, vllm_config) -> str:
        from torch_pjrt.compile.backend import _code_tag

        # The code that decides the pieces' programs: torch_pjrt's C code id, its plugin and
        # its compile package's sources (the backend's own AOT cache tag).
        return hashlib.sha256(_code_tag().encode()).hexdigest()[:10]

    def compile(self, graph: torch.fx.GraphModule, example_inputs: list[Any],
                compiler_config: dict[str, Any], compile_range, key: str | None = None):
        from torch_pjrt.compile.backend import tpu_backend

        # vLLM turns on AOTAutograd's strict cache mode, in which a piece that cannot be
        # pickled (one holding a tensor-parallel all_reduce: c10d's functional ops are not
        # picklable) fails to compile; here such a piece is compiled and only not cached by
        # AOTAutograd (its programs still go to torch_pjrt's disk cache)
        with torch._functorch.config.patch(strict_autograd_cache=False):
            compiled = tpu_backend(graph, example_inputs)
        # the handle only names the piece; load() rebuilds it through the backend's caches
        return compiled, (key or "tpu", str(compile_range))

    def load(self, handle, graph: torch.fx.GraphModule, example_inputs: list[Any],
             graph_index: int, compile_range):
        from torch_pjrt.compile.backend import tpu_backend

        with torch._functorch.config.patch(strict_autograd_cache=False):
            return tpu_backend(graph, example_inputs)
