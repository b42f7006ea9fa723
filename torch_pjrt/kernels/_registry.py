"""Kernels registered with the runtime, and the one op that calls them.

``tpu::kernel_call(Tensor[] args, str kernel) -> Tensor[]`` is an ordinary op of the tpu device:
the boxed dispatcher builds it like any aten op (its Meta function below gives the result
types), its lowering (csrc/ops/kernel.c) inlines the registered kernel as a ``func.call``, and
the `kernel` string (the fingerprint) is part of the program key. Strict runs it as one program,
defer_and_fuse records it with its neighbours, torch.compile captures it into the graph's
program: every mode takes the same path.
"""
from __future__ import annotations

import threading

import torch

from ._module import Kernel

_lock = threading.Lock()
_kernels: dict[str, Kernel] = {}   # id -> kernel; grows only (kernels live with the process)
_lib = None


def _kernel_call_meta(args, kernel):
    k = _kernels.get(kernel)
    if k is None:
        raise ValueError(f"tpu::kernel_call: no kernel registered as '{kernel}'")
    return [torch.empty(r.shape, dtype=r.dtype, device="meta") for r in k.results]


def _define() -> None:
    global _lib
    with _lock:
        if _lib is not None:
            return
        lib = torch.library.Library("tpu", "FRAGMENT")
        lib.define("kernel_call(Tensor[] args, str kernel) -> Tensor[]")
        lib.impl("kernel_call", _kernel_call_meta, "Meta")
        _lib = lib


def register(k: Kernel) -> Kernel:
    """Registers a prepared kernel with the runtime (once per id)."""
    _define()
    with _lock:
        if k.id in _kernels:
            return _kernels[k.id]
        from ..device import _C
        _C._kernel_register(k.id, k.callee, k.text)
        _kernels[k.id] = k
        return k


def check_inputs(what: str, k: Kernel, tensors) -> None:
    """The call's tensors against the kernel's argument types (TypeError for a dtype, ValueError
    for a count or a shape)."""
    if len(tensors) != len(k.args):
        raise ValueError(f"{what}: the kernel takes {len(k.args)} tensors, got {len(tensors)}")
    for i, (t, a) in enumerate(zip(tensors, k.args)):
        if t.dtype != a.dtype:
            raise TypeError(f"{what}: argument {i} must be {a.dtype}, got {t.dtype}")
        if tuple(t.shape) != a.shape:
            raise ValueError(f"{what}: argument {i} must have shape {list(a.shape)}, got "
                             f"{list(t.shape)}")


def call(k: Kernel, tensors) -> list[torch.Tensor]:
    """Runs (or records) the kernel on tpu tensors: one tpu::kernel_call."""
    _define()
    return list(torch.ops.tpu.kernel_call(list(tensors), k.id))
