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
- ``aot_cache`` (bool, default True): AOTAutograd's own persistent cache (the one Inductor uses,
  in its bundled form: the cache entry holds the forward and backward graphs and the pickled
  GraphRunners, see graph_runner.py) serves this backend too, so a restarted process does not
  trace and partition the joint graph again (Dynamo still traces, unless PyTorch's Dynamo cache
  is on: precompile.py). Entries live in Inductor's
  cache directory (``TORCHINDUCTOR_CACHE_DIR``) under a key tagged with this backend, its
  options, the plugin and the code of torch_pjrt (``_aot_cache_tag``), so they are never
  shared with Inductor's or with another build's. ``torch.compiler.config.force_disable_caches``
  turns it off as it does Inductor's.

What is specialized: Dynamo's graph stays symbolic (``dynamic=True``, ``mark_dynamic``,
automatic dynamic shapes; one Dynamo graph per pattern of which dims are dynamic, plus
recompiles when its guards fail), and each of its AOTAutograd graphs is captured once per
distinct concrete input signature: shapes, strides, dtypes, aliasing and the values of int and
float arguments (the symbolic sizes among them) -> one program each, cached in memory and on
disk. With ``buckets``, the padded dims take only the bucket sizes (and the sizes above the
largest), so they make at most that many signatures.

``mode=`` is accepted and changes nothing: a graph is already one captured program replayed per
call (what ``reduce-overhead``'s CUDA graphs give), and there is no autotuning to run. A whole
step as one program is ``torch.tpu.TPUGraph`` (torch_pjrt/graphs.py).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import os

import torch

from . import buckets, precompile
from .graph_runner import GraphRunner

OPTIONS = {"debug_dir": None, "capture": True, "buckets": None, "aot_cache": True}

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


@functools.lru_cache(maxsize=1)
def _code_tag() -> str:
    """The plugin, the C code id (``_C.identity()``) and a hash of this package's Python
    sources: what decides the graphs and GraphRunners an AOTAutograd cache entry holds."""
    from ..device import _C

    h = hashlib.sha256(_C.identity().encode())
    here = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()[:24]


def _aot_cache_tag(opts: dict) -> str:
    return f"torch_pjrt:{_code_tag()}:{sorted((k, repr(v)) for k, v in opts.items())!r}"


def _aot_cache(opts: dict):
    """Context for the aot_autograd call: AOTAutograd's bundled cache on, keyed apart from
    everyone else's entries (``cache_key_tag`` is part of the key), or nothing."""
    if not opts["aot_cache"]:
        return contextlib.nullcontext()
    import torch._functorch.config as functorch_config

    stack = contextlib.ExitStack()
    # force: AOTAutograd consults its cache for non-Inductor compilers only when forced;
    # bundled: the entry holds the compiled graphs themselves (our picklable GraphRunners);
    # non-lazy backward: a training graph's entry is written once its backward is compiled,
    # and making a GraphRunner costs nothing (it captures on its first call), so compile it now
    stack.enter_context(functorch_config.patch(enable_autograd_cache=True,
                                               bundled_autograd_cache=True,
                                               force_autograd_cache=True,
                                               force_non_lazy_backward_lowering=True))
    user_tag = torch.compiler.config.cache_key_tag
    stack.enter_context(torch.compiler.config.patch(
        cache_key_tag=f"{user_tag}|{_aot_cache_tag(opts)}"))
    return stack


def tpu_backend(gm: torch.fx.GraphModule, example_inputs, options=None, mode=None):
    """Dynamo backend entry point (``torch_dynamo_backends``: ``tpu``)."""
    from functorch.compile import min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    opts = _options(options)
    graph_id = next(_graph_ids)
    precompile.install()  # only does something under caching_precompile (precompile.py)

    def compiler(kind: str):
        def compile_graph(graph: torch.fx.GraphModule, inputs):
            return GraphRunner(graph, f"graph{graph_id}_{kind}", opts)  # boxed (graph_runner.py)

        return compile_graph

    with _aot_cache(opts):
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
