"""PyTorch's Dynamo cache (``torch._dynamo.config.caching_precompile``, env
``TORCH_CACHING_PRECOMPILE=1``) for this backend: a restarted process loads the compiled frames
(their guards and bytecode), AOTAutograd's graphs (this backend's GraphRunners, backend.py) and
the programs (the persistent compile cache) instead of tracing and compiling again.

Two things this module adds, both only while ``caching_precompile`` is on:

- **A workaround for a PyTorch bug that fails the compile of an optimizer's frame.** When Dynamo
  leaves a frame out of the package (``OutputGraph.bypass_package``: a graph holding parameters
  installed as attributes, which the optimizer's static-address tensors are, or a guard that
  cannot be serialized), it drops the graph's package, but ``_compile_inner``
  (torch/_dynamo/convert_frame.py) still holds the package it had before tracing and asserts
  that the frame's guards were serialized (``check_fn.guards_state must not be None``), so the
  whole compile fails. Such a frame should simply go unsaved, and that is what a bypassed
  entry's ``add_guarded_code`` already does (it returns without storing anything): the guards of
  a frame whose graph dropped its package get an empty placeholder, which is never stored. The
  frame still compiles and runs as without the cache; a restarted process traces it again.
- **Saving at exit.** PyTorch writes the Dynamo cache only when asked
  (``torch.compiler.save_cache_artifacts()``); a process that compiled graphs on ``tpu`` with
  the cache on asks at exit, so plain ``torch.compile`` code needs nothing more than the switch.

One more PyTorch behaviour under the switch is handled where it bites, in graph_runner.py
(GraphRunner.__getstate__/__setstate__): the AOTAutograd entry that the Dynamo cache saves is a
deep copy PyTorch makes (``PrecompileContext.record_artifact``) while the compile's
FakeTensorMode is on the dispatch mode stack, and torch.load, which unpickles a tensor's storage,
makes meta storages then: a graph's tensor constants (a Hugging Face Llama's) came back on the
meta device in the next process ("Tensor on device tpu:0 is not on the expected device meta!").

PyTorch's own behaviour with the switch on is unchanged: it drops identity guards (ID_MATCH,
CLOSURE_MATCH, ...) so that entries can be loaded in another process, and it bypasses frames it
cannot serialize (an optimizer's ``step``, whose state tensors Dynamo marks as static addresses
and whose guards include CLASS_MATCH): those are traced again in every process.
"""
from __future__ import annotations

import atexit
import logging

import torch

log = logging.getLogger(__name__)
_installed = False


def enabled() -> bool:
    return bool(torch._dynamo.config.caching_precompile)


def install() -> None:
    """Idempotent; called by the backend on each graph it compiles (cheap after the first)."""
    global _installed
    if _installed or not enabled():
        return
    _installed = True
    from torch._dynamo import guards

    manager = guards.CheckFunctionManager
    init = manager.__init__

    def __init__(self, code, output_graph, *args, **kwargs):
        init(self, code, output_graph, *args, **kwargs)
        # a bypassed frame: its graph dropped the package (bypass_package sets it to None)
        if self.guards_state is None and getattr(output_graph, "package", True) is None:
            self.guards_state = b""

    __init__.__wrapped__ = init
    manager.__init__ = __init__
    atexit.register(_save_at_exit)


def _save_at_exit() -> None:
    if not enabled():
        return
    try:
        torch.compiler.save_cache_artifacts()
    except Exception as e:  # never fail the interpreter's exit over a cache
        log.warning("torch_pjrt: saving the Dynamo cache at exit failed: %s", e)
