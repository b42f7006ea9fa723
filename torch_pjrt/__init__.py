"""torch_pjrt: a native PyTorch "tpu" device that runs every op through an OpenXLA PJRT plugin.

``import torch`` loads it automatically (entry point ``torch.backends``); ``import torch_pjrt``
does the same explicitly. After that ``torch.device("tpu")`` works and ``torch.tpu`` is the
device module (see torch_pjrt/device.py).

Registration (``_register``) is idempotent and happens once per process:
  1. PyTorch's PrivateUse1 backend is renamed "tpu";
  2. the plugin is chosen (torch_pjrt/_plugins.py) and handed to the native runtime, which
     loads it lazily on first use;
  3. ``torch.tpu`` is registered and the ``Tensor.tpu()`` / ``Module.tpu()`` /
     ``Storage.tpu()`` style methods are generated;
  4. PyTorch decompositions are registered for aten ops that have no lowering;
  5. the ``tpu_dist`` torch.distributed backend is registered (torch_pjrt/distributed).
"""

from __future__ import annotations

import logging
import os
import sys
import threading

__all__ = ["diagnostics", "export_stablehlo", "register"]

_log = logging.getLogger("torch_pjrt")
_register_lock = threading.Lock()
_registered = False


def _autoload() -> None:
    """Entry point PyTorch calls at ``import torch``. Must leave torch importable whatever
    happens: failures are logged once and kept for ``torch.tpu.diagnostics()``."""
    try:
        _register()
    except Exception as e:  # noqa: BLE001 - a failed device must not break `import torch`
        message = f"{type(e).__name__}: {e}"
        _log.warning("torch_pjrt: the tpu device is disabled: %s", message)
        try:
            from . import device

            device._note_problem("autoload", message)
        except Exception:  # noqa: BLE001 - nothing left to record into
            pass


def register() -> None:
    """Registers the tpu device (idempotent); raises if it cannot."""
    _register()


def _register() -> None:
    global _registered
    # Outside the lock: when torch is not imported yet, this import runs torch's autoload,
    # which calls _autoload() -> _register() in this same thread and does the work.
    import torch

    with _register_lock:
        if _registered:
            return
        from . import _plugins, config, device, modes

        name = torch._C._get_privateuse1_backend_name()
        if name != "tpu":
            if name != "privateuseone":
                raise RuntimeError(
                    f"PyTorch's PrivateUse1 device is already claimed by backend {name!r}; "
                    "torch_pjrt cannot register 'tpu' in this process"
                )
            torch.utils.rename_privateuse1_backend("tpu")

        if device._C is None:
            # Keep torch.tpu importable so diagnostics() can say why; direct imports fail.
            device._note_problem("extension", device._C_ERROR)
            _register_device_module(torch, device)
            raise ImportError(device._C_ERROR)

        # A missing plugin disables the device without failing registration: torch.tpu
        # reports it (is_available() False, _lazy_init raises the install advice).
        try:
            cfg = config.load()
            choice = _plugins.resolve(cfg)
        except (RuntimeError, ValueError) as e:
            device._note_problem("plugin", str(e))
        else:
            device._set_plugin(choice)
            if not device._C.is_initialized():
                # XLA logs INFO lines to stderr when the client starts; keep warnings and
                # errors only, unless the user chose a level.
                os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
                device._C._configure(choice.path, cfg.cpu_device_count)
                if choice.name == "cpu":
                    # now, before more threads have their own heap arenas (host_heap.h)
                    device._C._configure_host_heap()
                # a flag the plugin does not know would abort the process when it starts
                from . import _flags_probe

                refused = _flags_probe.rejected(choice.path, cfg.cache_dir,
                                                cfg.cache_readonly)
                if refused:
                    device._note_problem("plugin", refused)
                    device._C._refuse(refused)
            device._C._set_check_nan(cfg.check_nan)
            if cfg.exit_report:
                from . import exit_report

                exit_report.install()
            device._C._defer_set_max_ops(cfg.defer_max_ops)
            device._C._set_default_eager_mode(modes.MODES.index(cfg.eager_mode))
            try:
                device._C._configure_cache(cfg.cache_dir, cfg.cache_max_bytes,
                                           cfg.cache_shared, cfg.cache_readonly, cfg.cache_key)
            except RuntimeError as e:  # an unusable directory costs speed, not correctness
                _log.warning("torch_pjrt: persistent compile cache disabled: %s", e)

        _register_device_module(torch, device)
        # Ops without a StableHLO lowering go through PyTorch's decompositions before the CPU
        # fallback (torch_pjrt/_decompositions.py).
        from . import _decompositions

        _decompositions.register(set(device._C._lowered_ops()))
        # The first op's Meta kernel must not import torch._dynamo (_meta_no_dynamo.py).
        from . import _meta_no_dynamo

        _meta_no_dynamo.install()
        from . import _meta_alerts  # no CUDA nondeterminism alerts from Meta kernels

        _meta_alerts.install()
        from . import vision_ops  # torchvision's detection ops (nms, roi_align)

        vision_ops.register()
        from . import paged_attention_ops  # tpu::reshape_and_cache, tpu::paged_attention (serving)

        paged_attention_ops.register()
        from . import transformer_ops  # nn.MultiheadAttention's / TransformerEncoderLayer's fast path

        transformer_ops.register()
        from . import distribution_ops  # Gamma / Dirichlet sampling

        distribution_ops.register()
        from . import repeat_op  # repeat past rank 4 (the composite needs twice the rank)

        repeat_op.register()
        from . import grouped_mm  # torch._grouped_mm (MoE experts) without per-group shapes

        grouped_mm.register()
        from . import fake_rules  # fake tensors (torch.compile) as wide as the eager kernels

        fake_rules.register()
        from . import flex_attention  # torch.nn.attention.flex_attention on tpu

        flex_attention.install()
        _register_distributed(device)
        from . import inductor_route  # torch.compile(model) with no backend= on tpu graphs

        inductor_route.install()
        _registered = True


def _register_distributed(device) -> None:
    """Registers the tpu_dist torch.distributed backend (torch_pjrt/distributed). A failure
    costs distributed support only: it is logged and kept for diagnostics()."""
    try:
        from . import distributed

        distributed._register_backends()
        from .distributed import local

        local.install_parallel_comm()  # torch.nn.parallel.comm (nn.DataParallel) on tpu
    except Exception as e:  # noqa: BLE001 - the device itself works without it
        _log.warning("torch_pjrt: the tpu_dist distributed backend is disabled: %s", e)
        device._note_problem("distributed", f"{type(e).__name__}: {e}")


def _register_device_module(torch, device) -> None:
    if getattr(torch, "tpu", None) is not device:
        torch._register_device_module("tpu", device)
    from . import legacy_storage  # torch.tpu.FloatStorage, ... (tensor.storage_type())

    legacy_storage.install(device)
    if not hasattr(torch.Tensor, "tpu"):
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
        )
    _patch_dlpack_device(torch)


def _patch_dlpack_device(torch) -> None:
    """``Tensor.__dlpack_device__`` recognises the PrivateUse1 backend only by its default name
    ("privateuse1") and raises ValueError for a renamed one, so ``torch.from_dlpack`` of a tpu
    tensor failed before any capsule was made. tpu tensors report DLPack's extension device
    (kDLExtDev), the type PyTorch's own exporter writes into their capsules; every other tensor
    keeps PyTorch's answer."""
    original = torch.Tensor.__dlpack_device__
    if getattr(original, "_torch_pjrt_tpu", False):
        return

    def __dlpack_device__(self):
        # (subclasses with __torch_function__ keep PyTorch's dispatch to their override)
        if not torch.overrides.has_torch_function_unary(self) and self.device.type == "tpu":
            from torch.utils.dlpack import DLDeviceType

            return (DLDeviceType.kDLExtDev, self.device.index or 0)
        return original(self)

    __dlpack_device__._torch_pjrt_tpu = True
    __dlpack_device__.__doc__ = original.__doc__
    torch.Tensor.__dlpack_device__ = __dlpack_device__


def __getattr__(name: str):
    # Imported on first use: the compile package is not needed to use the device.
    if name == "export_stablehlo":
        from .compile.export import export_stablehlo

        return export_stablehlo
    raise AttributeError(f"module 'torch_pjrt' has no attribute {name!r}")


def diagnostics() -> dict:
    """Same as ``torch.tpu.diagnostics()``; works even when registration failed."""
    from . import device

    return device.diagnostics()


def _called_by_torch_autoload() -> bool:
    """True while torch's own import is loading backend entry points: then torch will call
    _autoload() itself, which must not raise, so nothing is registered at import time."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_import_device_backends" and "torch" in code.co_filename:
            return True
        frame = frame.f_back
    return False


# Registration runs at import unless torch's autoload is importing us (it calls _autoload next).
# Everything above is defined first: if `import torch` below this point triggers autoload while
# this module is half-imported, torch finds _autoload already defined.
if not _called_by_torch_autoload():
    _register()
