"""A whole decode step's model forward as one program (what CUDA graphs are to vLLM on GPUs).

Compiled serving runs the model as vLLM's pieces (one program each, between attention layers)
and two attention programs per layer, each dispatched from Python: a 12-layer model is 37
executions and their host work per step. A decode step (every request one new token) whose
attention metadata the builder laid out in fixed-shape device buffers (attention.py: rows
padded to the token bucket, contexts to a bucket of the longest one) is captured once per pair
of buckets into one plan instead: the pieces record their ops into it (graph_runner.py: no plan
of their own while a capture is active), the attention ops too, and each later step at that
pair is one execution. The plan's parameters are the step's input ids and positions; the
weights, the KV caches (written in place by the plan) and the metadata buffers (refilled by a
whole-buffer copy before every step) are storages the plan keeps, read as they are at each
run.

Not captured (run as before): prefill and mixed steps, eager mode, a step whose metadata is
not in the fixed layout, and any step whose capture breaks (a host read in the model, ...)."""

from __future__ import annotations

import torch

from torch_pjrt.compile.graph_runner import GraphRunner


class StepRunner(GraphRunner):
    """GraphRunner over a plain callable (no FX graph) returning a one-tuple."""

    def __init__(self, fn, name: str):
        super().__init__(fn, name, {"debug_dir": None, "capture": True})

    def _constant_storages(self) -> set[int]:
        return set()  # no graph constants: every storage it keeps is the model's or vLLM's

    def _run_recorded(self, args):
        return self.gm(*args)  # uncapturable: the step as it runs without capture


def fixed_decode_step() -> tuple | None:
    """The layout key of this step's attention metadata (vLLM's forward context) when it is all
    in the fixed decode layout, so the forward can be captured or replayed: the (tokens,
    context slots) bucket pairs of its layers' metadata. None otherwise."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    from torch_pjrt.serving.vllm.attention import TpuPagedAttentionMetadata

    if not is_forward_context_available():
        return None
    md = get_forward_context().attn_metadata
    if not (isinstance(md, dict) and md
            and all(isinstance(m, TpuPagedAttentionMetadata) and m.fixed for m in md.values())):
        return None
    return tuple(sorted({m.fixed for m in md.values()}))


def run(runners: dict, layout: tuple, model_forward, input_ids: torch.Tensor,
        positions: torch.Tensor):
    """model_forward(input_ids, positions) through the StepRunner of this token count and
    metadata layout (fixed_decode_step): one plan per pair of buckets."""
    key = (int(input_ids.shape[0]), layout)
    runner = runners.get(key)
    if runner is None:
        name = "decode_step_" + "_".join(f"{n}x{s}" for n, s in layout)
        runner = runners[key] = StepRunner(lambda ids, pos: (model_forward(ids, pos),), name)
    return runner(input_ids, positions)[0]
