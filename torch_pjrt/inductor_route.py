"""``torch.compile(model)`` as users write it: graphs on ``tpu`` go to this project's backend.

With no ``backend=`` argument (what most users and libraries write: Transformers' Trainer with
``torch_compile=True``, torchtitan's ``--compile.enable``, Diffusers), ``torch.compile`` hands
every Dynamo graph to Inductor through ``torch._TorchCompileInductorWrapper``. Inductor has a
device registration of its own for a device named "tpu" (Pallas code for Google's
``torch_tpu`` package), so on this project's ``tpu`` device it failed with
``ModuleNotFoundError: No module named 'torch_tpu'`` on any graph with an elementwise op.

``install()`` wraps that class's ``__call__``: a graph whose tensors are on ``tpu`` (its example
inputs, parameters and buffers, or, for a graph that takes none, the values its nodes produce)
is compiled by ``tpu_backend`` (one StableHLO program per AOTAutograd graph, compile/backend.py);
every other graph goes to Inductor unchanged. What ``mode=`` and ``options=`` mean for a tpu
graph (both are validated by PyTorch as Inductor options first, so a misspelt option still
raises PyTorch's own error):

- ``mode="default"``, ``"reduce-overhead"``, ``"max-autotune"``,
  ``"max-autotune-no-cudagraphs"``: the same compiled programs. Each graph is already captured
  whole as one program and replayed with one launch per call, which is what CUDA graphs give
  ``reduce-overhead`` on CUDA; there is no kernel autotuning to run (XLA picks its own fusions),
  so the max-autotune modes add nothing.
- ``options=``: Inductor's code-generation settings (Triton, C++, Pallas) do not apply to the
  programs this backend builds and are not consulted for tpu graphs, except
  ``wrap_inductor_compiled_regions``, which has the same meaning here (``_backend_options``).

``torch.compile(model, backend="inductor")`` is the same path. ``backend="tpu"`` remains the
way to pass this backend's own options (compile/backend.py). This module stays outside the
compile package so that installing the route costs no import (the package takes ~1 s).
"""
from __future__ import annotations

import threading

import torch

_MARK = "_torch_pjrt_tpu_route"
_LOOKUP_LOCK = threading.RLock()


def _on_tpu(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "tpu"


def graph_on_tpu(gm, example_inputs) -> bool:
    """Whether a Dynamo graph computes on ``tpu``: any example input, parameter or buffer there,
    or, when it has no tensor inputs at all, any node value there (a graph of factory calls)."""
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    if isinstance(gm, torch.nn.Module):
        tensors += list(gm.parameters()) + list(gm.buffers())
    if tensors:
        return any(_on_tpu(t) for t in tensors)
    graph = getattr(gm, "graph", None)
    if graph is None:
        return False
    for node in graph.nodes:
        # AOTAutograd's nodes carry "val", Dynamo's "example_value"; a factory call's device
        # argument says it too (torch.tensor([2], device="tpu") with no input at all)
        for key in ("val", "example_value"):
            val = node.meta.get(key)
            vals = val if isinstance(val, (list, tuple)) else (val,)
            if any(_on_tpu(v) for v in vals):
                return True
        device = node.kwargs.get("device") if node.op == "call_function" else None
        if isinstance(device, (str, torch.device)) and torch.device(device).type == "tpu":
            return True
    return False


def install() -> None:
    """Routes tpu graphs of Inductor-bound ``torch.compile`` calls to ``tpu_backend``
    (idempotent)."""
    cls = getattr(torch, "_TorchCompileInductorWrapper", None)
    if cls is None or getattr(cls.__call__, _MARK, False):
        return
    inductor_call = cls.__call__

    def __call__(self, model_, inputs_, *, config_patches=None):
        if graph_on_tpu(model_, inputs_):
            from .compile.backend import tpu_backend

            return tpu_backend(model_, inputs_, options=_backend_options(self.config))
        return inductor_call(self, model_, inputs_, config_patches=config_patches)

    setattr(__call__, _MARK, True)
    __call__.__doc__ = inductor_call.__doc__
    cls.__call__ = __call__
    _serialize_backend_lookup()


def _backend_options(inductor_options: dict) -> dict:
    """The one Inductor option with a meaning for this backend's graphs:
    ``wrap_inductor_compiled_regions`` (given to torch.compile, or set in Inductor's config),
    which makes each compiled graph one ``inductor_compiled_code`` op to TorchDispatchModes
    (selective activation checkpointing needs it; torchtitan sets it when it compiles
    flex_attention): the backend's ``wrap_compiled_regions``."""
    wrap = inductor_options.get("wrap_inductor_compiled_regions")
    if wrap is None:
        import sys

        config = sys.modules.get("torch._inductor.config")  # imported by torch.compile's path
        wrap = bool(getattr(config, "wrap_inductor_compiled_regions", False))
    return {"wrap_compiled_regions": True} if wrap else {}


def _serialize_backend_lookup() -> None:
    """``torch.compile(..., backend="tpu")`` from several threads at once (the ranks of
    ``torch_pjrt.distributed.run_threads``) raced in PyTorch's backend registry: the first
    lookup of an entry-point backend loads and registers it, unlocked, so a second thread
    registering the same name got ``AssertionError: duplicate name: tpu``. The wrapper class
    that does the lookup is constructed under one lock."""
    cls = getattr(torch, "_TorchCompileWrapper", None)
    if cls is None or getattr(cls.__init__, _MARK, False):
        return
    wrapper_init = cls.__init__

    def __init__(self, *args, **kwargs):
        with _LOOKUP_LOCK:
            wrapper_init(self, *args, **kwargs)

    setattr(__init__, _MARK, True)
    __init__.__doc__ = wrapper_init.__doc__
    cls.__init__ = __init__
