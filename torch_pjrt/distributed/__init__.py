"""``tpu_dist``: the torch.distributed backend of the ``tpu`` device.

Registered when torch_pjrt loads (autoload at ``import torch``), so plain PyTorch code works::

    dist.init_process_group()                          # picks tpu_dist for the tpu device
    dist.init_process_group("tpu_dist")                # or "tpu", the alias
    dist.init_process_group("cpu:gloo,tpu:tpu_dist")   # CPU tensors over Gloo as well

with ``torchrun`` (``env://``) or ``torch.multiprocessing.spawn``. Collectives on tpu tensors
are staged through host memory over Gloo from the torch wheel (the C++ backend in
csrc/bridge/distributed.cpp); docs/distributed.md describes the design and what a native
path on TPU/GPU plugins would do instead.

Each process uses ``tpu:<local rank>`` when the plugin has several devices (``LOCAL_RANK`` as
torchrun sets it, else the rank in the default group, modulo the device count), else ``tpu:0``;
the default group makes that device current when it is created, unless the process already
chose a device other than ``tpu:0``. ``local_device()`` returns it.

Ranks can also be threads of one process, each on its own ``tpu:<rank>`` (as PyTorch tests
DTensor)::

    from torch_pjrt.distributed import run_threads
    results = run_threads(fn, 4, x)   # fn(rank, x) in 4 threads, each a rank of a tpu_dist world

(torch_pjrt/distributed/threads.py; results in rank order, the first rank's exception raised
again in the caller.)
"""

from __future__ import annotations

import logging
import os
import threading
import warnings

import torch

__all__ = ["BACKEND", "ALIASES", "local_device", "stats", "run_threads", "transport",
           "use_kv_store"]

BACKEND = "tpu_dist"
# Other names init_process_group accepts for the same backend.
ALIASES = ("tpu",)

_log = logging.getLogger("torch_pjrt")

# Per thread: the device index of a run_threads rank thread (None elsewhere). Such a thread
# has chosen its device; LOCAL_RANK, which names the process's, does not apply to it.
_thread_state = threading.local()


def _thread_device() -> int | None:
    return getattr(_thread_state, "device", None)


def _register_backends() -> None:
    """Registers tpu_dist (and its aliases) with torch.distributed for the tpu device type.
    Idempotent. The first backend registered for a device type becomes its default, so
    ``init_process_group()`` without a backend picks tpu_dist for tpu tensors."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    for name in (BACKEND, *ALIASES):
        if name.upper() in dist.Backend._plugins:
            continue
        dist.Backend.register_backend(name, _create_backend, extended_api=True, devices=["tpu"])
    from . import topology

    topology._install()  # init_device_mesh("tpu", ...) follows the devices' physical topology


def _local_rank(group_rank: int) -> int:
    value = os.environ.get("LOCAL_RANK")
    if value is not None:
        try:
            return int(value)
        except ValueError:
            pass
    return group_rank


def local_device(rank: int | None = None) -> torch.device:
    """The tpu device this process uses: ``tpu:<local rank % device count>``.

    ``rank`` defaults to ``LOCAL_RANK`` (set by torchrun), else the rank in the default group,
    else 0; in a ``run_threads`` rank thread, that thread's ``tpu:<rank>``."""
    if rank is None and _thread_device() is not None:
        return torch.device("tpu", _thread_device())
    if rank is None:
        rank = _local_rank(0)
        if "LOCAL_RANK" not in os.environ:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                rank = dist.get_rank()
    n = torch.tpu.device_count()
    return torch.device("tpu", rank % n if n > 1 else 0)


def stats() -> dict:
    """Counters of the staged transport (collectives, uploads and how many of them aliased
    the host block instead of copying, downloads, host staging bytes held and cached)."""
    from .. import device

    return dict(device._C._dist_stats())


def transport(group=None) -> str | None:
    """Which transport moves ``group``'s tpu tensors (default: the default group):
    ``"native"`` (multi-device programs between the devices of this process), ``"staged"``
    (host memory over Gloo), or None when the group has no tpu_dist backend."""
    import torch.distributed as dist

    from .. import device

    pg = dist.group.WORLD if group is None else group
    try:
        backend = pg._get_backend(torch.device("tpu"))
    except Exception:  # no backend for the tpu device
        return None
    return device._C._dist_transport(backend) or None


def use_kv_store(store, prefix: str = "torch_pjrt/") -> None:
    """Creates the PJRT client with ``store`` (a c10d Store: the rendezvous store of a process
    group, e.g. ``torch.distributed.TCPStore``) as its key-value store, so that a plugin that
    runs one process per chip across hosts (libtpu, the CUDA plugin) can exchange its topology
    at client creation and number the job's devices globally. Call it after rendezvous and
    before the first use of a tpu device (RuntimeError after: the client exists). Every key the
    plugin uses is put under ``prefix``. The CPU plugin creates its client the same way and
    uses no key (its collectives stay within one process; across processes ``tpu_dist`` stages
    them through Gloo). The bridge: csrc/bridge/kv_store_bridge.cpp, csrc/runtime/kv_store.c."""
    from ..device import _C

    _C._KvStoreBridge(store, prefix).install()


def _create_backend(common_opts, backend_options):
    """The creator init_process_group / new_group call for tpu_dist (extended API): the native
    backend when the group's ranks are threads of one run_threads call (or
    TORCH_PJRT_DIST_TRANSPORT=native), else internal Gloo backends on store prefixes of this
    group's store, wrapped by the staging backend."""
    from .. import config, device

    if device._C is None:
        raise RuntimeError(f"tpu_dist needs the torch_pjrt extension: {device._C_ERROR}")
    if backend_options is not None:
        warnings.warn(
            f"tpu_dist ignores pg_options of type {type(backend_options).__name__}",
            stacklevel=3,
        )
    rank, size = common_opts.group_rank, common_opts.group_size
    ranks = list(common_opts.global_ranks_in_group)
    if not ranks:
        _select_device(rank)
    choice = config.load().dist_transport
    session = getattr(_thread_state, "session", None)
    if choice == "native" and session is None:
        raise RuntimeError(
            "TORCH_PJRT_DIST_TRANSPORT=native needs ranks that are threads of one process, each "
            "on its own device (torch_pjrt.distributed.run_threads); across processes only the "
            "staged transport exists here (unset it, or set it to staged)")
    if choice != "staged" and session is not None:
        return _native_backend(session, common_opts, rank, size, ranks)
    return _staged_backend(common_opts, rank, size, ranks)


def _native_backend(session, common_opts, rank: int, size: int, ranks: list):
    """Joins (or creates) the collective group this group's ranks share in one run_threads
    call: keyed by the group's name, which every rank thread gives the same group (each thread
    counts its groups alike). Rank thread g of the run is on tpu:g."""
    from .. import device

    members = ranks or list(range(size))
    timeout_ms = max(1, int(common_opts.timeout.total_seconds() * 1000))
    with session.lock:
        entry = session.cgroups.get(common_opts.group_id)
        # A group name comes back after destroy_process_group in the rank threads (c10d resets
        # its counter): a group every member already joined is not joined again.
        if entry is None or entry[1] == size or entry[2] != members:
            entry = [device._C._CollGroup(members, timeout_ms), 0, members]
            session.cgroups[common_opts.group_id] = entry
            if session.failed.is_set():  # made after the run failed: as dead as the others
                entry[0].shutdown("a rank of the run failed before this group was made")
        entry[1] += 1
        group = entry[0]
    return device._C._dist_native_backend(group, rank, size, common_opts.group_id,
                                          [int(r) for r in ranks], timeout_ms)


def _staged_backend(common_opts, rank: int, size: int, ranks: list):
    from torch.distributed import PrefixStore, ProcessGroupGloo

    from .. import device

    timeout = common_opts.timeout  # a timedelta
    # Two Gloo backends of the same ranks: one moves the data, the other carries the
    # fingerprint each collective is checked with before its data moves, and send headers
    # (csrc/bridge/distributed.cpp says why). The group's store is already prefixed by group
    # name and device type (c10d does it); the prefixes keep the two backends' keys apart.
    # Both share one Gloo device (one socket loop thread); the check backend's traffic is
    # small messages one at a time, so one worker thread serves it.
    gloo_device = ProcessGroupGloo.create_default_device()

    def make(prefix, threads):
        opts = ProcessGroupGloo._Options()
        opts._devices = [gloo_device]
        opts._threads = threads
        opts._timeout = timeout
        return ProcessGroupGloo(PrefixStore(prefix, common_opts.store), rank, size, opts)

    gloo = make("gloo/", 2)
    gloo.options.global_ranks_in_group = ranks
    gloo.options.group_name = common_opts.group_id
    gloo._set_sequence_number_for_group()
    check = make("check/", 1)
    return device._C._dist_backend(gloo, check, rank, size)


def _select_device(rank: int) -> None:
    if _thread_device() is not None:
        return  # a run_threads rank thread: it chose its device
    n = torch.tpu.device_count()
    if n <= 1 or torch.tpu.current_device() != 0:
        return
    index = _local_rank(rank) % n
    if index != 0:
        torch.tpu.set_device(index)
        _log.info("tpu_dist: rank %d uses tpu:%d", rank, index)


from .threads import run_threads  # noqa: E402  (needs _thread_state above)
