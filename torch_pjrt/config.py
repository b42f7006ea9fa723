"""The environment variables of the Python front, read here and nowhere else in Python.

Variables (the README's table lists all of them):

``TORCH_PJRT_PLUGIN``
    Which PJRT plugin to load: ``cpu``, ``cuda``, ``tpu``, or a path to a plugin ``.so``.
    Unset or empty: choose automatically (a TPU, else an NVIDIA GPU, else the CPU).
``TORCH_PJRT_CPU_DEVICE_COUNT``
    Number of devices the CPU plugin creates (default 1).
``TORCH_PJRT_EAGER_MODE``
    Initial eager mode: ``strict`` (default), ``debug`` or ``defer_and_fuse``. TorchTPU's
    ``TORCH_TPU_LAUNCH_BLOCKING=1`` selects ``debug`` and ``TORCH_TPU_DEFER_AND_FUSE=1``
    ``defer_and_fuse``, so scripts written for it behave the same.
``TORCH_PJRT_DEFER_MAX_OPS``
    Size bound of a defer_and_fuse graph: it is run before it exceeds this many ops
    (default 64: full graphs run asynchronously while the next one is recorded).
``TORCH_PJRT_CHECK_NAN``
    ``1``: every op's floating results are checked; the first op producing NaN or Inf raises
    RuntimeError naming it and its inputs (slow: a host sync per op).
``TORCH_PJRT_CACHE_DIR``
    Directory of the persistent compile cache (default ``$XDG_CACHE_HOME/torch_pjrt``, else
    ``~/.cache/torch_pjrt``); ``0`` disables it. Many processes and hosts may share it.
``TORCH_PJRT_CACHE_MAX_BYTES``
    Size bound of that directory; least recently used entries are evicted (default 4 GiB).
``TORCH_PJRT_CACHE_SHARED``
    ``1``: load entries owned by other users and entries in a directory writable by group or
    others (refused by default), and create files by the umask instead of 0600/0700.
``TORCH_PJRT_CACHE_KEY``
    A secret: every stored entry carries an HMAC-SHA256 tag under it, and entries without a
    valid tag are not loaded.
``TORCH_PJRT_CACHE_READONLY``
    ``1``: the cache is read, never written (no stores, no directory creation, no evictions).
``TORCH_PJRT_DIST_TRANSPORT``
    How ``tpu_dist`` moves a group's data: ``native`` (multi-device programs between the
    devices of this process: ranks that are ``run_threads`` threads), ``staged`` (host memory
    over Gloo), or unset/``auto``: native where the group's ranks are threads of one
    ``run_threads`` call, staged elsewhere. Read at each group's creation.
``TORCH_PJRT_EXIT_REPORT``
    ``1``: at exit the process writes one line to stderr, ``torch_pjrt exit report: {...}``
    (JSON: rank, CPU fallback ops with counts, the process-wide counters of
    ``torch.tpu.metrics()``), so that a program launched unchanged (``torchrun -m
    torchtitan.train``) still says what ran on the device (torch_pjrt/exit_report.py).

PyTorch's own ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns off loading torch_pjrt on
``import torch``; it is read by torch, not here. Native code reads these switches where they act:
``TORCH_PJRT_CPU_FALLBACK`` (csrc/bridge/dispatch.cpp), ``TORCH_PJRT_DUMP_ON_ERROR``
(csrc/graph/call.c), ``TORCH_PJRT_CHECK_BOUNDS`` (csrc/runtime/index_checks.c),
``TORCH_PJRT_SMALL_GEMM`` (csrc/runtime/ffi_kernels.c), ``TORCH_PJRT_GEMM_THREADS``
(csrc/runtime/small_gemm.c), ``TORCH_PJRT_COMPILE_THREADS`` (csrc/graph/compile_async.c) and
``TORCH_PJRT_FUSE_COLLECTIVES`` (csrc/bridge/native_dist.cpp: ``0`` keeps a compiled graph's
functional collectives out of its program on native groups, each then its own program); the C runtime reads ``TORCH_PJRT_PLUGIN`` itself only when Python configured
no plugin (a path), e.g. in C tests.

The values are read when :func:`load` is called (once, at registration), so a process sees
one consistent configuration.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Optional

PLUGIN_NAMES = ("cpu", "cuda", "tpu")


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch_pjrt")


DEFAULT_CACHE_MAX_BYTES = 4 << 30


@dataclasses.dataclass(frozen=True)
class Config:
    plugin: str  # "" (automatic), one of PLUGIN_NAMES, or a file path
    cpu_device_count: int
    cache_dir: str = dataclasses.field(default_factory=default_cache_dir)  # "" = disabled
    cache_max_bytes: int = DEFAULT_CACHE_MAX_BYTES
    cache_shared: bool = False
    cache_readonly: bool = False
    cache_key: bytes = dataclasses.field(default=b"", repr=False)  # a secret: never shown
    eager_mode: str = "strict"
    defer_max_ops: int = 64
    check_nan: bool = False
    dist_transport: str = "auto"  # "auto", "native" or "staged"
    exit_report: bool = False


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if value < 1:
        raise ValueError(f"{name}={raw!r} must be at least 1")
    return value


def load(env: Optional[Mapping[str, str]] = None) -> Config:
    """Reads the configuration from ``env`` (default: ``os.environ``); raises ValueError on a
    malformed value, naming the variable."""
    env = os.environ if env is None else env
    plugin = env.get("TORCH_PJRT_PLUGIN", "").strip()
    if plugin.lower() in PLUGIN_NAMES:
        plugin = plugin.lower()
    cache_dir = env.get("TORCH_PJRT_CACHE_DIR", "").strip() or default_cache_dir()
    if cache_dir == "0":
        cache_dir = ""
    mode = env.get("TORCH_PJRT_EAGER_MODE", "").strip().lower()
    if not mode and env.get("TORCH_TPU_LAUNCH_BLOCKING", "").strip() == "1":
        mode = "debug"
    if not mode and env.get("TORCH_TPU_DEFER_AND_FUSE", "").strip() == "1":
        mode = "defer_and_fuse"
    if mode and mode not in ("strict", "debug", "defer_and_fuse"):
        raise ValueError(f"TORCH_PJRT_EAGER_MODE={mode!r} is not one of strict, debug, "
                         "defer_and_fuse")
    transport = env.get("TORCH_PJRT_DIST_TRANSPORT", "").strip().lower() or "auto"
    if transport not in ("auto", "native", "staged"):
        raise ValueError(f"TORCH_PJRT_DIST_TRANSPORT={transport!r} is not one of native, staged, "
                         "auto")
    return Config(
        dist_transport=transport,
        exit_report=env.get("TORCH_PJRT_EXIT_REPORT", "").strip() == "1",
        eager_mode=mode or "strict",
        defer_max_ops=_positive_int(env, "TORCH_PJRT_DEFER_MAX_OPS", 64),
        check_nan=env.get("TORCH_PJRT_CHECK_NAN", "").strip() == "1",
        plugin=plugin,
        cpu_device_count=_positive_int(env, "TORCH_PJRT_CPU_DEVICE_COUNT", 1),
        cache_dir=cache_dir,
        cache_max_bytes=_positive_int(env, "TORCH_PJRT_CACHE_MAX_BYTES", DEFAULT_CACHE_MAX_BYTES),
        cache_shared=env.get("TORCH_PJRT_CACHE_SHARED", "").strip() == "1",
        cache_readonly=env.get("TORCH_PJRT_CACHE_READONLY", "").strip() == "1",
        # the secret's bytes as given (os.fsencode: what the environment held)
        cache_key=os.fsencode(env.get("TORCH_PJRT_CACHE_KEY", "")),
    )
