"""The legacy typed-storage classes of the tpu device: ``torch.tpu.FloatStorage`` and the rest.

PyTorch answers ``tensor.storage_type()`` and ``isinstance(storage, <module>.FloatStorage)`` from
the device module: for a PrivateUse1 device it looks the class up on ``torch.<backend name>``
and tells a class's device by the last part of its ``__module__``. CUDA defines one class per
dtype in ``torch.cuda``; these are tpu's (without them ``storage_type()`` of a tpu tensor was
None). Constructing one makes a tpu storage, as ``torch.cuda.FloatStorage(n)`` makes a CUDA one.
Host-only constructors (shared memory, buffers) are refused as CUDA refuses them.
"""
from __future__ import annotations

import torch
from torch._utils import classproperty
from torch.storage import _LegacyStorage, _warn_typed_storage_removal


class _TpuLegacyStorage(_LegacyStorage):
    @classmethod
    def from_buffer(cls, *args, **kwargs):
        _warn_typed_storage_removal()
        raise RuntimeError("from_buffer: Not available for tpu storage")

    @classmethod
    def _new_with_weak_ptr(cls, *args, **kwargs):
        raise RuntimeError("_new_with_weak_ptr: Not available for tpu storage")

    @classmethod
    def _new_shared_filename(cls, manager, obj, size, *, device=None, dtype=None):
        raise RuntimeError("_new_shared_filename: Not available for tpu storage")


def _make(name: str, dtype: torch.dtype) -> type:
    def _dtype(cls):
        return dtype

    def public_dtype(cls):
        _warn_typed_storage_removal()
        return dtype

    cls = type(name, (_TpuLegacyStorage,), {
        "dtype": classproperty(public_dtype),
        "_dtype": classproperty(_dtype),
        # the device PyTorch's storage code reads from the class (torch.storage's
        # _get_device_from_module takes the module name's last part)
        "__module__": "torch." + torch._C._get_privateuse1_backend_name(),
        "__qualname__": name,
    })
    return cls


def install(module) -> None:
    """Adds one class per dtype PyTorch names a legacy storage for (FloatStorage, ...) to the
    device module."""
    for dtype, name in torch.storage._dtype_to_storage_type_map().items():
        if not hasattr(module, name):
            setattr(module, name, _make(name, dtype))
