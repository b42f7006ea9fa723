"""The Dynamo backend: AOTAutograd around a GraphRunner per forward, backward and inference
graph.

Options (``torch.compile(m, backend="tpu", options={...})``):

- ``debug_dir`` (str): writes each graph's FX code (``<graph>.fx.py``) and, once captured, the
  StableHLO text of its program (``<graph>.stablehlo.mlir``) into this directory.
- ``capture`` (bool, default True): False runs every call of a graph through the
  defer_and_fuse recorder instead of replaying a captured program (for debugging the capture).
- ``buckets`` (dict): ``{"sizes": [16, 32, 64], "dims": {"idx": 1}, "value": 0}`` pads the
  declared dims of the declared arguments up to the next size (``value`` in the padding) and
  cuts the outputs back, so that a dynamic dim makes one program per bucket; a size above the
  largest bucket runs unpadded. For dims whose padding at the end the model makes safe (its
  outputs at the real positions do not depend on the padded ones): a causal model's sequence
  dimension, a batch dimension. Graphs whose results cannot be cut back exactly (an output
  reducing over a padded dim, input mutations, ...) raise ValueError (buckets.py).

What is specialized: Dynamo's graph stays symbolic (``dynamic=True``, ``mark_dynamic``,
automatic dynamic shapes; one Dynamo graph per pattern of which dims are dynamic, plus
recompiles when its guards fail), and each of its AOTAutograd graphs is captured once per
distinct concrete input signature: shapes, strides, dtypes, aliasing and the values of int and
float arguments (the symbolic sizes among them) -> one program each, cached in memory and on
disk. With ``buckets``, the padded dims take only the bucket sizes (and the sizes above the
largest), so they make at most that many signatures.

``mode=`` is accepted and ignored (there are no autotuning modes).
"""
from __future__ import annotations

import itertools
import os

import torch

from . import buckets
from .graph_runner import GraphRunner

OPTIONS = {"debug_dir": None, "capture": True, "buckets": None}

_graph_ids = itertools.count()


def _options(options) -> dict:
    opts = dict(OPTIONS)
    for key, value in (options or {}).items():
        if key not in OPTIONS:
            raise ValueError(f"torch.compile(backend='tpu'): unknown option {key!r}; "
                             f"known options: {', '.join(sorted(OPTIONS))}")
        opts[key] = value
    opts["buckets"] = buckets.parse(opts["buckets"])
    if opts["debug_dir"] is not None:
        os.makedirs(opts["debug_dir"], exist_ok=True)
    return opts


def tpu_backend(gm: torch.fx.GraphModule, example_inputs, options=None, mode=None):
    """Dynamo backend entry point (``torch_dynamo_backends``: ``tpu``)."""
    from functorch.compile import min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    opts = _options(options)
    graph_id = next(_graph_ids)

    def compiler(kind: str):
        def compile_graph(graph: torch.fx.GraphModule, inputs):
            return GraphRunner(graph, f"graph{graph_id}_{kind}", opts)  # boxed (graph_runner.py)

        return compile_graph

    compiled = aot_autograd(
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        partition_fn=min_cut_rematerialization_partition,
        keep_inference_input_mutations=True,
    )(gm, example_inputs)
    if opts["buckets"] is not None:
        # outside AOTAutograd's function: the padding and the cut-back are eager autograd ops,
        # so the compiled forward and backward both run at the bucket sizes
        compiled = buckets.wrap(gm, compiled, opts["buckets"])
    return compiled
