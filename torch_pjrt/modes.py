"""Eager modes of the tpu device.

- ``strict`` (default): each op is one program, dispatched asynchronously.
- ``debug``: each op runs synchronously; a device error names the op and its inputs, and
  indexing ops (index, index_select, gather, scatter*, index_put_, embedding, take,
  nll_loss targets) raise the exception CPU raises for out-of-range indices instead of XLA's
  silent clamping.
- ``defer_and_fuse``: ops are recorded, not run; each run of recorded ops becomes one fused
  program (csrc/graph/defer.c) when something needs its results: a copy to the host, ``.item()``,
  printing, a synchronize or event, a mode switch, a CPU fallback, the size bound
  (TORCH_PJRT_DEFER_MAX_OPS), or a detected loop-iteration boundary. ``pending_graph()`` shows
  what is recorded; ``flush()`` runs it.

``set_eager_mode`` sets the process default; ``eager_mode(...)`` overrides it for the calling
thread inside a ``with`` block. The environment (read in config.py) chooses the initial default:
TORCH_PJRT_EAGER_MODE, or TorchTPU's TORCH_TPU_LAUNCH_BLOCKING=1 (debug).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

MODES = ("strict", "debug", "defer_and_fuse")


def _code(mode: str) -> int:
    if mode not in MODES:
        raise ValueError(f"unknown eager mode {mode!r}; expected one of {', '.join(MODES)}")
    return MODES.index(mode)


def _C():
    from .device import _C as native

    if native is None:
        raise RuntimeError("the torch_pjrt extension is not loaded")
    return native


def set_eager_mode(mode: str) -> None:
    """Sets the eager mode of the process (threads inside `eager_mode(...)` keep theirs)."""
    _C()._set_default_eager_mode(_code(mode))


def get_eager_mode() -> str:
    """The eager mode of the calling thread."""
    return MODES[_C()._eager_mode()]


@contextlib.contextmanager
def eager_mode(mode: str) -> Iterator[None]:
    """Runs the block in `mode` on the calling thread only."""
    code = _code(mode)
    native = _C()
    previous = native._thread_eager_mode()
    native._set_thread_eager_mode(code)
    try:
        yield
    finally:
        native._set_thread_eager_mode(previous)


def flush() -> None:
    """Runs the ops recorded by the defer_and_fuse mode (a no-op when nothing is recorded)."""
    _C()._defer_flush()


def pending_graph() -> str:
    """The ops recorded by the defer_and_fuse mode and not yet run, one per line, with the
    storages (``s<id>:<dtype>``) each one touches."""
    return _C()._defer_graph_text()
