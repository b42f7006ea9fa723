"""``torch.tpu``: the device module PyTorch looks up for the "tpu" device.

It mirrors the parts of ``torch.cuda`` that device-generic PyTorch code and users call:
device selection, synchronization, RNG, memory counters, streams and events, lazy
initialization, plus ``metrics()`` and ``diagnostics()``.

Invariants:
- Importing this module never starts the runtime and never raises, even when the native
  extension cannot load (``is_available()`` is then False and ``diagnostics()`` says why).
- The runtime starts in ``_lazy_init`` (PyTorch calls it before creating tpu tensors) or when
  native code needs a device; seeds set before that are queued and applied at initialization,
  so ``torch.manual_seed`` does not start the runtime.
- After a fork, a child of a process whose runtime was running cannot use the device (PJRT
  client threads do not survive fork): ``_is_in_bad_fork()`` is True there.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
from typing import Any, Callable, Optional, Union

import torch

try:
    from . import _C
except ImportError as _e:  # not built, or built against another torch
    _C = None
    _C_ERROR: Optional[str] = f"cannot import torch_pjrt._C: {_e}"
else:
    _C_ERROR = None

_DeviceLike = Union[int, str, torch.device, None]

# Module state. Written under _lock (except the fork flag, set in the forked child only).
_lock = threading.RLock()
_initialized = False
_in_bad_fork = False
_queued: list[Callable[[], None]] = []  # seed calls made before initialization
_default_generators: dict[int, torch.Generator] = {}
_device_count_cache: Optional[int] = None
_plugin: Any = None  # a _plugins.PluginChoice once registration resolved one
_problems: dict[str, str] = {}  # stage ("plugin", "autoload", ...) -> what went wrong


def _after_fork_in_child() -> None:
    global _in_bad_fork, _initialized
    if _C is not None and _C.is_initialized():
        _in_bad_fork = True
    _initialized = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# --- registration hooks (called by torch_pjrt/__init__.py) -------------------------------------


def _set_plugin(choice: Any) -> None:
    global _plugin
    _plugin = choice


def _note_problem(stage: str, message: str) -> None:
    """Records why something failed, for diagnostics() and _lazy_init's error."""
    with _lock:
        _problems[stage] = message


# --- initialization ----------------------------------------------------------------------------


def _is_in_bad_fork() -> bool:
    return _in_bad_fork


def is_initialized() -> bool:
    return _C is not None and not _in_bad_fork and _C.is_initialized()


def _lazy_init() -> None:
    """Starts the runtime (loads the plugin, creates the client); raises RuntimeError saying
    why it cannot. Called by PyTorch before it creates tpu tensors."""
    global _initialized
    if _initialized:
        return
    with _lock:
        if _initialized:
            return
        if _in_bad_fork:
            raise RuntimeError(
                "cannot re-initialize the tpu runtime in a forked subprocess; use the 'spawn' "
                "start method for multiprocessing"
            )
        if _C is None:
            raise RuntimeError(_C_ERROR)
        if "plugin" in _problems:
            raise RuntimeError(_problems["plugin"])
        _C._init()
        _initialized = True
        queued, _queued[:] = list(_queued), []
    for call in queued:
        call()


def is_available() -> bool:
    """True when at least one tpu device can be used. Never raises."""
    return device_count() > 0


def device_count() -> int:
    """Number of tpu devices; 0 when the runtime cannot start. Never raises."""
    global _device_count_cache
    if _device_count_cache is not None:
        return _device_count_cache
    if _C is None or _in_bad_fork or "plugin" in _problems:
        return 0
    n = _C.device_count()
    if n > 0:
        _device_count_cache = n
    return n


# --- device selection --------------------------------------------------------------------------


def _index(device: _DeviceLike = None, optional: bool = True) -> int:
    """The device index `device` names; None (when optional) is the current device."""
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "tpu":
            raise ValueError(f"expected a tpu device, got {device}")
        device = device.index
    if device is None:
        if not optional:
            raise ValueError("a tpu device index is required")
        return current_device()
    if not isinstance(device, int) or isinstance(device, bool):
        raise TypeError(f"expected a device index, name or torch.device, got {device!r}")
    return device


def current_device() -> int:
    """Index of the calling thread's current tpu device (starts at 0 in every thread)."""
    return _C.current_device() if _C is not None else 0


def set_device(device: _DeviceLike) -> None:
    """Makes `device` the calling thread's current device. As with CUDA, a negative index
    changes nothing and an index the runtime does not have raises torch.AcceleratorError (a
    RuntimeError)."""
    index = _index(device)
    if index < 0:
        return  # like torch.cuda.set_device(-1): no change
    _lazy_init()
    _C.set_device(index)


class device:
    """Context manager that makes `device` current inside the block."""

    def __init__(self, device: _DeviceLike):
        self.idx = -1 if device is None else _index(device)
        self.prev_idx = -1

    def __enter__(self) -> None:
        self.prev_idx = current_device()
        if self.idx >= 0 and self.idx != self.prev_idx:
            set_device(self.idx)

    def __exit__(self, *exc: object) -> bool:
        if self.idx >= 0 and self.idx != self.prev_idx:
            set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of tensor `obj` current (no-op for non-tpu)."""

    def __init__(self, obj: torch.Tensor):
        super().__init__(obj.get_device() if obj.device.type == "tpu" else -1)


def synchronize(device: _DeviceLike = None) -> None:
    """Waits for all work submitted to `device` (default: the current device); raises the
    first device error since the last synchronize."""
    _lazy_init()
    _C.synchronize(_index(device))


def _property_index(device: _DeviceLike) -> int:
    """The index for get_device_properties/get_device_name; like torch.cuda's, an index out of
    range raises AssertionError("Invalid device id")."""
    _lazy_init()
    index = _index(device)
    if index < 0 or index >= device_count():
        raise AssertionError("Invalid device id")
    return index


def get_device_name(device: _DeviceLike = None) -> str:
    """The plugin's device kind, e.g. "cpu" or "TPU v4"."""
    return _C.get_device_name(_property_index(device))


@dataclasses.dataclass(frozen=True)
class _DeviceProperties:
    name: str
    index: int
    platform: str
    platform_version: str
    plugin_path: str
    api_version: tuple
    total_memory: int  # bytes; 0 when the plugin does not say

    def __repr__(self) -> str:
        return (
            f"_DeviceProperties(name='{self.name}', index={self.index}, "
            f"platform='{self.platform}', api_version={self.api_version[0]}."
            f"{self.api_version[1]}, total_memory={self.total_memory // (1024 * 1024)}MB)"
        )


def get_device_properties(device: _DeviceLike = None) -> _DeviceProperties:
    index = _property_index(device)
    return _DeviceProperties(
        name=_C.get_device_name(index),
        index=index,
        platform=_C.platform_name(),
        platform_version=_C.platform_version(),
        plugin_path=_C.plugin_path(),
        api_version=tuple(_C.api_version()),
        total_memory=_total_memory(index),
    )


def _total_memory(index: int) -> int:
    try:
        return int(_C.mem_get_info(index)[1])
    except NotImplementedError:  # the plugin does not say
        return 0


def mem_get_info(device: _DeviceLike = None) -> tuple[int, int]:
    """(free, total) bytes of the device's memory, as torch.cuda.mem_get_info.

    From the plugin's memory statistics; on the CPU plugin, whose buffers are host memory, the
    host's available and physical memory. NotImplementedError when the plugin reports neither."""
    free, total = _C.mem_get_info(_property_index(device))
    return int(free), int(total)


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes torch.autocast("tpu", dtype=...) accepts (its default is float16, as CUDA's)."""
    return [torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Like torch.cuda.is_bf16_supported: bfloat16 works on every PJRT device (XLA emulates it
    where the hardware lacks it)."""
    return True


# --- random numbers ----------------------------------------------------------------------------


def default_generator(device: _DeviceLike = None) -> torch.Generator:
    """The default torch.Generator of `device` (the same object on every call)."""
    _lazy_init()
    index = _index(device)
    with _lock:
        gen = _default_generators.get(index)
        if gen is None:
            gen = _default_generators[index] = _C.default_generator(index)
    return gen


def __getattr__(name: str) -> Any:
    if name == "default_generators":  # like torch.cuda.default_generators
        return tuple(default_generator(i) for i in range(device_count()))
    raise AttributeError(f"module 'torch.tpu' has no attribute {name!r}")


def _run_or_queue(call: Callable[[], None]) -> None:
    with _lock:
        if not is_initialized():
            _queued.append(call)
            return
    _lazy_init()
    call()


def manual_seed(seed: int) -> None:
    """Seeds the current device's generator (queued until the runtime starts)."""
    seed = int(seed)
    index = current_device()
    _run_or_queue(lambda: default_generator(index).manual_seed(seed))


def manual_seed_all(seed: int) -> None:
    """Seeds every device's generator (queued until the runtime starts)."""
    seed = int(seed)

    def apply() -> None:
        for i in range(device_count()):
            default_generator(i).manual_seed(seed)

    _run_or_queue(apply)


def seed() -> None:
    """Seeds the current device's generator with a non-deterministic number."""
    index = current_device()
    _run_or_queue(lambda: default_generator(index).seed())


def seed_all() -> None:
    """Seeds every device's generator with the same non-deterministic number."""

    def apply() -> None:
        value = default_generator(0).seed()
        for i in range(1, device_count()):
            default_generator(i).manual_seed(value)

    _run_or_queue(apply)


def initial_seed() -> int:
    return default_generator().initial_seed()


def get_rng_state(device: _DeviceLike = "tpu") -> torch.Tensor:
    """The generator state of `device`: a CPU uint8 tensor (seed, offset)."""
    _lazy_init()
    return _C.get_rng_state(_index(device))


def set_rng_state(new_state: torch.Tensor, device: _DeviceLike = "tpu") -> None:
    _lazy_init()
    _C.set_rng_state(new_state, _index(device))


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


# --- memory ------------------------------------------------------------------------------------
# Storages are exact-size device buffers with no cache, so allocated == reserved == active.
# Counters are per device. As torch.cuda's, they answer 0 before the runtime starts, and once
# it runs an index it does not have raises RuntimeError (from _C).


def memory_allocated(device: _DeviceLike = None) -> int:
    """Bytes held by live tpu storages on `device`."""
    return _C.memory_allocated(_index(device)) if _C is not None else 0


def max_memory_allocated(device: _DeviceLike = None) -> int:
    """Peak of memory_allocated() since the start or the last reset_peak_memory_stats()."""
    return _C.max_memory_allocated(_index(device)) if _C is not None else 0


def reset_peak_memory_stats(device: _DeviceLike = None) -> None:
    if _C is not None:
        _C.reset_peak_memory_stats(_index(device))


memory_reserved = memory_allocated
max_memory_reserved = max_memory_allocated


def empty_cache() -> None:
    """Nothing is cached: freed storages return their buffers to PJRT at once."""


def memory_stats(device: _DeviceLike = None) -> collections.OrderedDict:
    index = _index(device)
    current, peak = memory_allocated(index), max_memory_allocated(index)
    stats = {}
    for kind in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes"):
        stats[f"{kind}.all.current"] = current
        stats[f"{kind}.all.peak"] = peak
    stats["num_live_storages"] = _C.live_storages(index) if _C is not None else 0
    stats["num_ooms"] = _C.oom_count(index) if _C is not None else 0
    return collections.OrderedDict(sorted(stats.items()))


# The fraction last set per device index (the C budget is in bytes; this is what it came from).
_memory_fraction: dict = {}


def set_per_process_memory_fraction(fraction: float, device: _DeviceLike = None) -> None:
    """Caps the bytes of live tpu tensors on `device` at fraction * total memory, as
    torch.cuda's: an allocation past it raises torch.OutOfMemoryError (with the sizes) and
    allocates nothing, and the process goes on. 1.0 lifts the cap. Tensors already allocated
    stay; a cap below them only stops new allocations."""
    _lazy_init()
    index = _property_index(device)
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    total = _total_memory(index)
    if fraction < 1 and total <= 0:
        raise RuntimeError("set_per_process_memory_fraction: the plugin reports no memory size "
                           "for this device, so a fraction of it cannot be set")
    _C.set_memory_limit(index, -1 if fraction == 1 else int(fraction * total))
    _memory_fraction[index] = fraction


def get_per_process_memory_fraction(device: _DeviceLike = None) -> float:
    """The fraction set by set_per_process_memory_fraction (1.0 when none was set)."""
    _lazy_init()
    return _memory_fraction.get(_property_index(device), 1.0)


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def memory_summary(device: _DeviceLike = None, abbreviated: bool = False) -> str:
    """A readable table of memory_stats() for `device`, as torch.cuda.memory_summary gives (the
    tpu allocator holds no cache, so allocated, reserved and active bytes are the same)."""
    index = _index(device)
    st = memory_stats(index)
    limit = _C.memory_limit(index) if _C is not None else -1
    free_total = None
    if _C is not None:
        try:
            free_total = mem_get_info(index)
        except (NotImplementedError, RuntimeError):
            pass
    rows = [("Allocated memory", _fmt_bytes(st["allocated_bytes.all.current"]),
             _fmt_bytes(st["allocated_bytes.all.peak"])),
            ("Live tensors' storages", str(st["num_live_storages"]), "")]
    if not abbreviated:
        rows.append(("Per-process limit", "none" if limit < 0 else _fmt_bytes(limit), ""))
        if free_total is not None:
            rows.append(("Device free / total", f"{_fmt_bytes(free_total[0])} / "
                         f"{_fmt_bytes(free_total[1])}", ""))
    width = 72
    lines = ["=" * width, f" tpu memory summary, device {index}".ljust(width), "-" * width,
             f" {'Metric':<32}{'Current':>20}{'Peak':>18} ", "-" * width]
    lines += [f" {name:<32}{cur:>20}{peak:>18} " for name, cur, peak in rows]
    lines.append("=" * width)
    return "\n".join(lines) + "\n"


# --- streams and events ------------------------------------------------------------------------
# One stream per device (see csrc/bridge/guard.cpp): work is ordered by data dependencies, and
# events snapshot the executions in flight, so waiting on or timing an event is real.


class Stream(torch.Stream):
    """The tpu stream of a device (each device has exactly one, the default stream)."""

    def __new__(cls, device: _DeviceLike = None, priority: int = 0, **kwargs: Any) -> "Stream":
        if "stream_id" in kwargs:  # the (stream_id, device_index, device_type) form
            return super().__new__(cls, priority=priority, **kwargs)
        _lazy_init()
        index = _index(device)
        _C.check_device(index)  # as torch.cuda.Stream(device=n): a missing device raises
        return super().__new__(cls, device=torch.device("tpu", index), priority=priority)


class Event(torch.Event):
    """A point in the device's work: record() snapshots the executions in flight;
    synchronize()/query() wait for/poll them; elapsed_time() is the time between two events'
    completions in milliseconds."""

    def __new__(
        cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> "Event":
        _lazy_init()
        return super().__new__(
            cls,
            device=torch.device("tpu", current_device()),
            enable_timing=enable_timing,
            blocking=blocking,
            interprocess=interprocess,
        )

    def elapsed_time(self, end_event: torch.Event) -> float:
        """Milliseconds from this event's completion to `end_event`'s (waits for both)."""
        if type(end_event) is torch.Event:
            return super().elapsed_time(end_event)
        # torch.Event.elapsed_time rejects subclasses as its argument; time the two backend
        # events (their event_id is the runtime marker) directly instead.
        if not isinstance(end_event, torch.Event) or end_event.device.type != "tpu":
            raise TypeError(f"expected a tpu Event, got {end_event!r}")
        return _C._event_elapsed_ms(self.event_id, end_event.event_id)


def current_stream(device: _DeviceLike = None) -> Stream:
    return Stream(device)


default_stream = current_stream


def set_stream(stream: torch.Stream) -> None:
    """Accepts a tpu stream; as each device has one stream there is nothing to switch."""
    if stream.device.type != "tpu":
        raise ValueError(f"expected a tpu stream, got {stream}")


class stream:
    """Context manager selecting `stream`'s device (its only stream is always current)."""

    def __init__(self, s: Optional[torch.Stream]):
        self._device = device(s.device if s is not None else None)

    def __enter__(self) -> None:
        self._device.__enter__()

    def __exit__(self, *exc: object) -> bool:
        return self._device.__exit__(*exc)


def pending_executions(device: _DeviceLike = None) -> int:
    """Executions submitted to `device` and not yet complete (shows asynchrony)."""
    return _C.pending_executions(_index(device)) if _C is not None else 0


# --- observability -----------------------------------------------------------------------------


def metrics(device: _DeviceLike = None) -> dict[str, int]:
    """Without an argument, the process-wide counters: compiles, cache hits/misses,
    executions, transfers (host to device, device to host, device to device), fallbacks.
    With a device (an index, "tpu:1", a torch.device), that device's own counters: the
    programs it executed and the copies into and out of it (``transfers_to_device``,
    ``transfers_to_host``, ``transfers_from_other_devices``, ``transfers_to_other_devices``)."""
    if _C is None:
        return {}
    if device is None:
        return _C.metrics()
    return _C.device_metrics(_index(device))


def step_profile():
    """Where compiled steps spend their time: ``with torch.tpu.step_profile() as p:`` and
    ``with p.step(): ...`` per step, then ``p.table()`` / ``p.summary()``: device time per
    program, host time in the compile backend, in Dynamo's and AOTAutograd's wrappers, and the
    rest (torch_pjrt/compile/attribution.py)."""
    from .compile.attribution import StepProfile

    return StepProfile()


def peak_flops(dtype=None, device: _DeviceLike = None) -> tuple[float, str]:
    """Peak FLOP/s of a device for matrix products in ``dtype`` (default bfloat16) and how
    it was found: published figures for TPUs/GPUs, cores x operations per cycle x clock for
    the CPU plugin (torch_pjrt/peak_flops.py). For MFU."""
    import torch

    from .peak_flops import peak_flops as _peak

    return _peak(torch.bfloat16 if dtype is None else dtype, device)


def fallback_ops() -> dict[str, int]:
    """aten ops that ran on the CPU through the fallback, with their counts."""
    return dict(_C.fallback_ops()) if _C is not None else {}


from .modes import eager_mode, flush, get_eager_mode, pending_graph, set_eager_mode  # noqa: E402,F401,E501
from .graphs import TPUGraph, graph  # noqa: E402,F401


def cache_stats() -> dict[str, Any]:
    """The persistent compile cache: its directory ("" when disabled), its trust settings
    (``shared``, ``readonly``, ``keyed``: TORCH_PJRT_CACHE_SHARED / _READONLY / _KEY) and this
    process's hits, misses, stores, bytes read/written, corrupt entries replaced, evictions,
    entries refused as untrusted (``disk_cache_refused_entries``) and the last warning."""
    return dict(_C.cache_stats()) if _C is not None else {}


def reset_metrics() -> None:
    if _C is not None:
        _C.reset_metrics()


def diagnostics() -> dict[str, Any]:
    """What torch_pjrt found: extension, plugin, runtime, devices, and, when the device is
    unavailable, why. Starts the runtime if it can; never raises."""
    from . import config

    info: dict[str, Any] = {"extension": "loaded" if _C is not None else _C_ERROR}
    try:
        info["config"] = dataclasses.asdict(config.load())
    except ValueError as e:
        info["config"] = str(e)
    if _plugin is not None:
        info["plugin"] = dataclasses.asdict(_plugin)
    with _lock:
        info["problems"] = dict(_problems)
    info["bad_fork"] = _in_bad_fork
    reason = None
    try:
        _lazy_init()
    except Exception as e:  # the answer to "why is it unavailable"
        reason = str(e)
    info["initialized"] = is_initialized()
    if reason is None and is_initialized():
        info.update(
            device_count=device_count(),
            device_name=_C.get_device_name(0),
            platform=_C.platform_name(),
            platform_version=_C.platform_version(),
            plugin_path=_C.plugin_path(),
            api_version=tuple(_C.api_version()),
            identity=_C.identity(),
        )
    else:
        info["device_count"] = 0
    info["available"] = reason is None and device_count() > 0
    info["reason"] = reason
    return info
