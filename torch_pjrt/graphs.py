"""``torch.tpu.TPUGraph`` and ``torch.tpu.graph``: CUDA graphs' API on this device. The work a
block issues on ``tpu`` (a whole training step: forward, the backward the autograd engine runs
on its own thread, the optimizer) is recorded once into one program; ``replay()`` runs that
program, one execution, no Python, no dispatch::

    static_x, static_y = x0.to("tpu"), y0.to("tpu")
    for _ in range(3):                       # warm-up: optimizer state, lazy init
        step(static_x, static_y)
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        static_loss = step(static_x, static_y)
    for x, y in loader:
        static_x.copy_(x); static_y.copy_(y)
        g.replay()                           # static_loss, parameters, state: updated in place

As with CUDA graphs:

- The capture runs nothing: every tensor keeps what it held before it, and one created inside
  the block (``static_loss``) holds zeros until the first ``replay()``.
- A replay reads and writes the same tensors the capture touched (the static inputs, the
  parameters, their ``.grad``, the optimizer's state, the block's results), in place. Python
  is not run again: side effects on Python objects (a counter, a learning-rate scheduler, a
  ``.grad`` set to None and recreated) are not replayed, so warm up first and zero gradients
  with ``zero_grad(set_to_none=False)`` inside the captured step.
- Random ops draw fresh numbers on every replay from the device's default generator.
- What cannot be recorded raises: a host read inside the block (``.item()``, printing a tensor,
  ``torch.tpu.synchronize()``), a CPU fallback, a data-dependent shape, an op on another device.
  Unlike CUDA, the work recorded up to that point has then run (it is not lost), and
  ``capture_end`` raises RuntimeError.

A plain ``torch.compile`` step is several programs (forward, backward, optimizer, the eager
glue between them); its replay under a TPUGraph is one (benchmarks/bench_compile_attribution.py
measures both). ``pool``, ``stream`` and ``capture_error_mode`` are accepted for source
compatibility with CUDA code and have no effect (one recorder per process, no memory pools).
"""
from __future__ import annotations

import warnings

from . import modes


class _Native:
    """torch_pjrt.device's _C, looked up when used (device.py imports this module)."""

    def __getattr__(self, name):
        from .device import _C as native

        return getattr(native, name)


_C = _Native()


class _EmptyPlan:
    def run(self, inputs, outputs):
        pass

    def text(self):
        return ""


_EMPTY = _EmptyPlan()


class TPUGraph:
    """A recorded program of tpu work (``torch.cuda.CUDAGraph``'s methods)."""

    def __init__(self, keep_graph: bool = False):
        self._plan = None
        self._default_mode = None

    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        if self._plan is not None:
            raise RuntimeError("TPUGraph: this graph already holds a capture; reset() it first")
        if _C._capture_active():
            raise RuntimeError("TPUGraph: another capture is in progress")
        # nothing in flight (as torch.cuda.graph synchronizes first): Strict ops still waiting
        # for a background compile would run, and flush, in the middle of the capture
        _C.synchronize(-1)
        # the autograd engine runs the backward on a thread of its own, which follows the
        # process's default eager mode: recording for the capture's duration (set before it
        # begins: a mode switch runs what is pending, which would break a capture)
        self._default_mode = _C._default_eager_mode()
        _C._set_default_eager_mode(modes._code("defer_and_fuse"))
        try:
            _C._capture_begin()
        except BaseException:
            self._restore_mode()
            raise

    def capture_end(self) -> None:
        broken = _C.metrics()["graph_captures_broken"]
        try:
            plan = _C._capture_end_unrun([], [])
        finally:
            self._restore_mode()
        if plan is None and _C.metrics()["graph_captures_broken"] == broken:
            # nothing was recorded (no tpu work in the block): replays do nothing, as an empty
            # CUDA graph's do
            warnings.warn("TPUGraph: the capture recorded no tpu work", stacklevel=3)
            self._plan = _EMPTY
            return
        if plan is None:
            raise RuntimeError(
                "TPUGraph: the capture could not be recorded as one program (a host read such "
                "as .item() or printing a tensor, a synchronize, a CPU fallback, a "
                "data-dependent shape or an op on another device inside it); what it recorded "
                "has run as eager ops")
        self._plan = plan

    def _abort(self) -> None:
        try:
            _C._capture_abort()
        finally:
            self._restore_mode()

    def _restore_mode(self) -> None:
        if self._default_mode is not None:
            _C._set_default_eager_mode(self._default_mode)
            self._default_mode = None

    def replay(self) -> None:
        if self._plan is None:
            raise RuntimeError("TPUGraph: replay() before a capture")
        self._plan.run([], [])

    def reset(self) -> None:
        self._plan = None

    def pool(self):
        return None

    def program_text(self) -> str:
        """The StableHLO text of the recorded program."""
        if self._plan is None:
            raise RuntimeError("TPUGraph: no capture")
        return self._plan.text()


class graph:
    """``with torch.tpu.graph(g): ...`` records the block into ``g`` (``torch.cuda.graph``)."""

    def __init__(self, tpu_graph: TPUGraph, pool=None, stream=None,
                 capture_error_mode: str = "global"):
        self.tpu_graph = tpu_graph

    def __enter__(self):
        self.tpu_graph.capture_begin()
        return self.tpu_graph

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.tpu_graph._abort()
            return False
        self.tpu_graph.capture_end()
        return False
