"""Choosing the PJRT plugin file: a name (cpu, cuda, tpu), a path, or automatic.

Automatic order: libtpu when it is installed and a TPU is attached; else the CUDA plugin when
it is installed and an NVIDIA GPU is present; else the CPU plugin. Packages are located with
``importlib.util.find_spec`` rather than imported where possible, so choosing costs no plugin
initialization: the runtime dlopens the chosen file later, on first use.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
from typing import Optional

from . import config as _config

# The pip packages that provide each plugin, for error messages.
INSTALL_HINT = {
    "cpu": "pip install lammps-jax-pjrt-cpu",
    "cuda": "pip install jax-cuda13-pjrt  (or jax-cuda12-pjrt for CUDA 12)",
    "tpu": "pip install libtpu",
}


@dataclasses.dataclass(frozen=True)
class PluginChoice:
    name: str  # "cpu", "cuda", "tpu" or "path"
    path: str  # the .so to dlopen
    reason: str  # why this one was chosen, for diagnostics()


def _package_dir(module: str) -> Optional[str]:
    """Directory of an installed package, without importing it (its parents are imported)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _cpu_plugin() -> Optional[str]:
    try:
        import lammps_jax_pjrt_cpu  # tiny: only computes PLUGIN_PATH
    except ImportError:
        return None
    path = str(lammps_jax_pjrt_cpu.PLUGIN_PATH)
    return path if os.path.isfile(path) else None


def _cuda_plugin() -> Optional[str]:
    for module in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"):
        d = _package_dir(module)
        if d and os.path.isfile(os.path.join(d, "xla_cuda_plugin.so")):
            return os.path.join(d, "xla_cuda_plugin.so")
    return None


def _tpu_plugin() -> Optional[str]:
    d = _package_dir("libtpu")
    if d and os.path.isfile(os.path.join(d, "libtpu.so")):
        return os.path.join(d, "libtpu.so")
    return None


_FINDERS = {"cpu": _cpu_plugin, "cuda": _cuda_plugin, "tpu": _tpu_plugin}


def tpu_present() -> bool:
    """A TPU chip is attached: /dev/accel* (v4 and older) or numbered /dev/vfio/* (v5+)."""
    if glob.glob("/dev/accel*"):
        return True
    try:
        return any(name.isdigit() for name in os.listdir("/dev/vfio"))
    except OSError:
        return False


def nvidia_gpu_present() -> bool:
    return os.path.exists("/dev/nvidia0")


def resolve(cfg: Optional[_config.Config] = None) -> PluginChoice:
    """The plugin to load under ``cfg`` (default: the environment). Raises RuntimeError naming
    the package to install when the requested plugin is missing."""
    cfg = _config.load() if cfg is None else cfg
    spec = cfg.plugin
    if spec in _FINDERS:
        path = _FINDERS[spec]()
        if path is None:
            raise RuntimeError(
                f"TORCH_PJRT_PLUGIN={spec} but the {spec} PJRT plugin is not installed: "
                f"{INSTALL_HINT[spec]}"
            )
        return PluginChoice(spec, path, f"TORCH_PJRT_PLUGIN={spec}")
    if spec:
        if not os.path.isfile(spec):
            raise RuntimeError(
                f"TORCH_PJRT_PLUGIN={spec!r} is neither cpu, cuda, tpu nor an existing file"
            )
        return PluginChoice("path", os.path.abspath(spec), "TORCH_PJRT_PLUGIN is a path")

    if tpu_present():
        path = _tpu_plugin()
        if path:
            return PluginChoice("tpu", path, "automatic: a TPU is attached and libtpu is installed")
    if nvidia_gpu_present():
        path = _cuda_plugin()
        if path:
            return PluginChoice(
                "cuda", path, "automatic: an NVIDIA GPU is present and the CUDA plugin is installed"
            )
    path = _cpu_plugin()
    if path:
        return PluginChoice("cpu", path, "automatic: the CPU plugin (no TPU or GPU plugin applies)")
    raise RuntimeError(
        "no PJRT plugin is installed; for the CPU: " + INSTALL_HINT["cpu"]
        + "; for NVIDIA GPUs: " + INSTALL_HINT["cuda"] + "; for TPUs: " + INSTALL_HINT["tpu"]
    )
