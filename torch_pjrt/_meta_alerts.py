"""Drops the CUDA nondeterminism alerts PyTorch's Meta kernels raise for tpu calls.

torch_pjrt takes each op's output metadata from PyTorch's Meta kernels, called on plain meta
tensors. Several Python Meta kernels take a plain meta tensor for a CUDA one
(``torch._meta_registrations.device_hint`` defaults to "cuda") and, under
``torch.use_deterministic_algorithms(True)``, raise CUDA's alerts: ``torch.median(x, 0)`` of a
tpu tensor raised "median CUDA with indices output does not have a deterministic
implementation", which CPU does not raise and tpu's lowering (a stable sort) does not deserve.
tpu's own alerts are raised by the dispatch layer (csrc/bridge/kernel_checks.cpp). An alert
raised from any other caller (user code on the meta device, FakeTensor tracing) is unchanged.
"""
from __future__ import annotations

import functools

import torch._prims_common as _utils


def install() -> None:
    original = _utils.alert_not_deterministic
    if getattr(original, "_torch_pjrt_wrapped", False):
        return
    from .device import _C

    @functools.wraps(original)
    def alert_not_deterministic(caller: str) -> None:
        if _C._in_meta_kernel():
            return
        original(caller)

    alert_not_deterministic._torch_pjrt_wrapped = True
    _utils.alert_not_deterministic = alert_not_deterministic
