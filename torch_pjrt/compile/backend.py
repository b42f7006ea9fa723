"""The Dynamo backend: AOTAutograd around a GraphRunner per forward, backward and inference
graph.

Options (``torch.compile(m, backend="tpu", options={...})``):

- ``debug_dir`` (str): writes each graph's FX code (``<graph>.fx.py``) and, once captured, the
  StableHLO text of its program (``<graph>.stablehlo.mlir``) into this directory.
- ``capture`` (bool, default True): False runs every call of a graph through the
  defer_and_fuse recorder instead of replaying a captured program (for debugging the capture).

``mode=`` is accepted and ignored (there are no autotuning modes).
"""
from __future__ import annotations

import itertools
import os

import torch

from .graph_runner import GraphRunner

OPTIONS = {"debug_dir": None, "capture": True}

_graph_ids = itertools.count()


def _options(options) -> dict:
    opts = dict(OPTIONS)
    for key, value in (options or {}).items():
        if key not in OPTIONS:
            raise ValueError(f"torch.compile(backend='tpu'): unknown option {key!r}; "
                             f"known options: {', '.join(sorted(OPTIONS))}")
        opts[key] = value
    if opts["debug_dir"] is not None:
        os.makedirs(opts["debug_dir"], exist_ok=True)
    return opts


def tpu_backend(gm: torch.fx.GraphModule, example_inputs, options=None, mode=None):
    """Dynamo backend entry point (``torch_dynamo_backends``: ``tpu``)."""
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    opts = _options(options)
    graph_id = next(_graph_ids)

    def compiler(kind: str):
        def compile_graph(graph: torch.fx.GraphModule, inputs):
            return make_boxed_func(GraphRunner(graph, f"graph{graph_id}_{kind}", opts))

        return compile_graph

    return aot_autograd(
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        partition_fn=min_cut_rematerialization_partition,
        keep_inference_input_mutations=True,
    )(gm, example_inputs)
