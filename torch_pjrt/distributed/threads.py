"""Ranks that are threads of one process: ``run_threads(fn, world_size, *args)``.

Each of ``world_size`` threads is a rank of its own ``tpu_dist`` world on ``tpu:<rank>``: it
calls ``dist.init_process_group`` itself, so its default group, ``new_group``, ``get_rank``,
``get_world_size`` and ``init_device_mesh`` are its own, and then runs ``fn(rank, *args)``.
The results come back in rank order; the first exception a rank raises (first in time) is
raised again in the caller, with a note naming its rank.

How the world is made per thread (facts of torch 2.13 c10d, checked on the installed wheel):

- Every c10d function reads its state through the module global
  ``torch.distributed.distributed_c10d._world`` at call time (default group, group maps,
  group counter, tags, coalescing state; ``GroupMember.WORLD`` reads ``_world.default_pg``).
  While a ``run_threads`` call runs, that global is a dispatcher (``_ThreadWorlds``) that
  answers from a world of the calling rank thread's own, and from the process's world in every
  other thread.
- Groups are also registered by name in a C++ registry (``_resolve_process_group``, used by
  the functional collectives that DTensor calls). Rank threads create groups with the same
  names ("0", "1", ...), so the registry is made per thread with
  ``torch._C._distributed_c10d._set_thread_isolation_mode(True)``. That mode is process-wide:
  while it is on, every thread, the caller's included, sees a registry of its own (the
  process's groups are not resolvable by name until it ends).
- The autograd engine runs a backward on one worker thread per device, where the rank's
  thread-local world and registry are not visible; autograd multithreading (a per-thread
  switch) is therefore turned off in each rank thread, so each rank's backward runs on its
  own thread.
- The current tpu device is per thread in torch_pjrt (csrc/bridge/guard.cpp keeps it in a
  ``thread_local``, like CUDA's): each rank thread calls ``torch.tpu.set_device(rank)``.

Transport: ``tpu_dist`` sees that a group's ranks are threads of this call (each rank thread
carries its session) and runs its collectives natively, one multi-device program per call
(csrc/bridge/native_dist.cpp); ``TORCH_PJRT_DIST_TRANSPORT=staged`` keeps host staging over
Gloo instead. Nothing here depends on which.
"""

from __future__ import annotations

import datetime
import sys
import threading
import time
import traceback
from typing import Any, Callable

import torch

__all__ = ["run_threads"]

# The attributes of c10d's _World that c10d functions read and write.
_WORLD_FIELDS = (
    "default_pg",
    "pg_map",
    "pg_names",
    "pg_group_ranks",
    "pg_backend_config",
    "group_count",
    "tags_to_pg",
    "pg_to_tag",
    "pg_coalesce_state",
    "comms",
)


class _RankWorld:
    """One rank thread's c10d state (what c10d's process-wide _World holds in module globals)."""

    def __init__(self) -> None:
        self.default_pg = None
        self.pg_map: dict = {}
        self.pg_names: dict = {}
        self.pg_group_ranks: dict = {}
        self.pg_backend_config: dict = {}
        self.group_count = 0
        self.tags_to_pg: dict = {}
        self.pg_to_tag: dict = {}
        self.pg_coalesce_state: dict = {}
        self.comms: list = []

    @property
    def pg_config_info(self) -> list:
        # c10d's own description of a world, computed from this world's maps.
        from torch.distributed.distributed_c10d import _World

        return _World.pg_config_info.fget(self)


def _forwarded(name: str) -> property:
    def get(self):
        return getattr(self._current(), name)

    def set(self, value):
        setattr(self._current(), name, value)

    return property(get, set)


class _ThreadWorlds:
    """Stands in for c10d's ``_world`` while rank threads run: a rank thread's own world in
    that thread, the process's world (the object it replaced) in every other thread."""

    def __init__(self, process_world) -> None:
        self._process = process_world
        self._local = threading.local()

    def _current(self):
        world = getattr(self._local, "world", None)
        return self._process if world is None else world



for _name in (*_WORLD_FIELDS, "pg_config_info"):
    setattr(_ThreadWorlds, _name, _forwarded(_name))
del _name


# Installation of the per-thread world, shared by concurrent run_threads calls: the first
# installs it, the last one out restores what was there.
_install_lock = threading.Lock()
_install_count = 0
# What the first install replaced: c10d's world, its other module globals that
# init_process_group sets (_backend, _default_pg_init_method), sys.excepthook (which
# init_process_group wraps with a "[rank<r>]: " prefix, each time).
_saved: dict | None = None
_C10D_GLOBALS = ("_world", "_backend", "_default_pg_init_method")


def _swap_fake_mode_lock(lock):
    """Sets DTensor's lock around fake-tensor sharding propagation (a nullcontext by default;
    DTensor documents it for multi-threaded runs); returns the one it replaced."""
    try:
        from torch.distributed.tensor._sharding_prop import ShardingPropagator
    except ImportError:  # no DTensor in this torch
        return None
    old = ShardingPropagator._fake_mode_lock
    if lock is not None:
        ShardingPropagator._fake_mode_lock = lock
    return old


def _install() -> _ThreadWorlds:
    global _install_count, _saved
    import torch.distributed.distributed_c10d as c10d

    with _install_lock:
        if _install_count == 0:
            _saved = {name: getattr(c10d, name, None) for name in _C10D_GLOBALS}
            _saved["excepthook"] = sys.excepthook
            c10d._world = _ThreadWorlds(_saved["_world"])
            _saved["fake_mode_lock"] = _swap_fake_mode_lock(threading.Lock())
            torch._C._distributed_c10d._set_thread_isolation_mode(True)
        _install_count += 1
        return c10d._world


def _uninstall() -> None:
    global _install_count, _saved
    import torch.distributed.distributed_c10d as c10d

    with _install_lock:
        _install_count -= 1
        if _install_count > 0:
            return
        saved, _saved = _saved, None
        for name in _C10D_GLOBALS:
            setattr(c10d, name, saved[name])
        sys.excepthook = saved["excepthook"]
        _swap_fake_mode_lock(saved["fake_mode_lock"])
        process_world = saved["_world"]
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
        # init_process_group in a rank thread set c10d's process-wide "global rank" (used in
        # its log messages); give it back to the process's default group.
        pg = process_world.default_pg
        torch._C._distributed_c10d._set_global_rank(pg.rank() if pg is not None else -1)


class _Session:
    """One run_threads call: the ranks' results and failures, and the release of the
    per-thread world once the caller and every rank thread are done with it."""

    def __init__(self, world_size: int) -> None:
        self.results: list = [None] * world_size
        self.failures: list[tuple[int, BaseException]] = []  # in the order they happened
        self.lock = threading.Lock()
        self.failed = threading.Event()
        self.holders = world_size + 1  # the rank threads and the caller
        # The native transport's collective groups of this run, by group name: [the group,
        # ranks that joined it, its global ranks] (torch_pjrt/distributed/__init__.py).
        self.cgroups: dict = {}

    def fail(self, rank: int, exc: BaseException) -> None:
        with self.lock:
            self.failures.append((rank, exc))
            first = not self.failed.is_set()
            self.failed.set()
            groups = [entry[0] for entry in self.cgroups.values()]
        # Wake every rank waiting in a native group, also one the failed rank never joined (a
        # sub-group it would have created after the point where it failed): the run has
        # failed, nothing waited for can come any more.
        if first:
            for group in groups:
                group.shutdown(f"rank {rank} of the run failed: {type(exc).__name__}")

    def release(self) -> None:
        with self.lock:
            self.holders -= 1
            last = self.holders == 0
        if last:
            _uninstall()


def _teardown(world: _RankWorld, abort: bool) -> None:
    """Destroys every group of a rank thread's world. After a failure the groups are
    aborted first (tpu_dist stops taking calls and fails those queued), and the thread's
    references to them are dropped so their connections close and peers waiting on this rank
    fail at once instead of at the timeout."""
    import torch.distributed as dist

    if world.default_pg is None and not world.pg_map:
        return
    if abort:
        for pg in list(world.pg_map):
            try:
                pg.abort()
            except Exception:  # a backend without abort, or already stopped
                pass
    try:
        dist.destroy_process_group()
    except Exception:
        # destroy_process_group refuses when the default group is gone but others are not;
        # clear what is left by hand.
        world.default_pg = None
        for field in ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config",
                      "tags_to_pg", "pg_to_tag", "pg_coalesce_state"):
            getattr(world, field).clear()
        world.comms.clear()


def _no_shared_fake_results() -> None:
    """DTensor's sharding propagation runs its ops on fake tensors in every rank thread at
    once, and FakeTensorMode's dispatch cache is one per process: a rank could get back a fake
    result made in another rank's thread, on that rank's device (FakeTensorDeviceMismatchError
    in FSDP2 + tensor parallelism on 4 ranks). The cache is turned off in this thread (Dynamo's
    config is per thread, so only rank threads lose it), and the propagation serialized by the
    lock DTensor provides for multi-threaded use (set in _install)."""
    import torch._dynamo.config as dynamo_config

    dynamo_config.fake_tensor_cache_enabled = False


def _rank_main(session: _Session, worlds: _ThreadWorlds, store, rank: int, world_size: int,
               backend: str, timeout: datetime.timedelta, fn: Callable, args: tuple,
               kwargs: dict) -> None:
    import torch.distributed as dist

    from . import _thread_state

    world = _RankWorld()
    worlds._local.world = world
    _thread_state.device = rank
    _thread_state.session = session
    failed = False
    try:
        torch.tpu.set_device(rank)
        # Autograd's multithreading switch is per thread: off here, this rank's backward runs
        # on this thread (where its world is visible), not on the engine's device thread.
        torch._C._set_multithreading_enabled(False)
        _no_shared_fake_results()
        dist.init_process_group(backend, rank=rank, world_size=world_size, store=store,
                                timeout=timeout)
        session.results[rank] = fn(rank, *args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - handed to the caller
        failed = True
        session.fail(rank, exc)
        # The traceback's frames hold fn's locals (groups, meshes, modules): clear them so
        # the groups can go away and close their connections.
        traceback.clear_frames(exc.__traceback__)
        del exc
    finally:
        try:
            _teardown(world, abort=failed or session.failed.is_set())
        except BaseException as exc:  # noqa: BLE001
            if not failed:
                session.fail(rank, exc)
        worlds._local.world = None
        _thread_state.device = None
        _thread_state.session = None
        del world
        session.release()


def run_threads(fn: Callable[..., Any], world_size: int, *args: Any,
                timeout: float | datetime.timedelta = 300.0, backend: str = "tpu_dist",
                **kwargs: Any) -> list:
    """Runs ``fn(rank, *args, **kwargs)`` in ``world_size`` threads, each already a rank of a
    fresh ``backend`` world (``tpu_dist`` by default) with ``tpu:<rank>`` its current device,
    and returns the ranks' results in rank order.

    The ranks meet through a ``HashStore`` of their own. In each thread the default group,
    ``new_group``, ``get_rank``, ``get_world_size``, ``DeviceMesh`` / ``init_device_mesh``
    are that rank's (see the module docstring for how), so DDP, FSDP2, DTensor, tensor
    parallelism and pipelining run as they would in ``world_size`` processes.

    If a rank raises, its groups are aborted and destroyed (peers waiting on it then fail
    too), and the first exception raised (in time) is raised here once every thread ended,
    with a note naming the rank (and the other ranks' failures). ``timeout`` (seconds or a
    timedelta) is each group's timeout and also bounds the wait for the threads: a rank still
    running that long after the others finished, or after a failure, raises ``TimeoutError``
    here (its thread cannot be killed: it is left running, a daemon, and the per-thread world
    stays installed until it ends). Every group is destroyed when its thread ends, and c10d's
    process-wide state is restored after the last rank, so ``init_process_group`` works in the
    process afterwards.

    Needs ``world_size`` tpu devices (on the CPU plugin: ``TORCH_PJRT_CPU_DEVICE_COUNT`` set
    before torch_pjrt starts its runtime).
    """
    import torch.distributed as dist

    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if isinstance(timeout, datetime.timedelta):
        pg_timeout = timeout
    else:
        pg_timeout = datetime.timedelta(seconds=float(timeout))
    seconds = pg_timeout.total_seconds()
    if seconds <= 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    count = torch.tpu.device_count()
    if count < world_size:
        raise ValueError(
            f"run_threads needs {world_size} tpu devices (one per rank), the runtime has "
            f"{count}; on the CPU plugin set TORCH_PJRT_CPU_DEVICE_COUNT={world_size} (or more) "
            "before torch_pjrt starts")
    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available")
    from . import _register_backends

    _register_backends()

    store = dist.HashStore()
    session = _Session(world_size)
    worlds = _install()
    threads = []
    try:
        for rank in range(world_size):
            t = threading.Thread(
                target=_rank_main, name=f"run_threads-rank{rank}", daemon=True,
                args=(session, worlds, store, rank, world_size, backend, pg_timeout, fn, args,
                      kwargs))
            t.start()
            threads.append(t)
        stuck = _join(threads, session, seconds)
    finally:
        # Threads never started hold no share of the world.
        for _ in range(world_size - len(threads)):
            session.release()
        session.release()

    if session.failures:
        rank, exc = session.failures[0]
        note = f"run_threads: raised in rank {rank} of {world_size}"
        others = [f"rank {r}: {type(e).__name__}: {e}" for r, e in session.failures[1:]]
        if others:
            note += "; later failures: " + "; ".join(others)
        if stuck:
            note += f"; ranks {stuck} still running after {seconds:g} s"
        try:
            exc.add_note(note)
        except Exception:
            pass
        raise exc
    if stuck:
        raise TimeoutError(
            f"run_threads: ranks {stuck} of {world_size} still running {seconds:g} s after the "
            "others finished; their threads are left running")
    return list(session.results)


def _join(threads: list, session: _Session, seconds: float) -> list[int]:
    """Waits for the rank threads: as long as they need while none has failed and some have
    not finished, then at most ``seconds`` more once one failed or all but some finished.
    Returns the ranks still running."""
    deadline = None
    while True:
        alive = [i for i, t in enumerate(threads) if t.is_alive()]
        if not alive:
            return []
        now = time.monotonic()
        if deadline is None and (session.failed.is_set() or len(alive) < len(threads)):
            deadline = now + seconds
        if deadline is not None and now >= deadline:
            return alive
        threads[alive[0]].join(0.05 if deadline is None else min(0.05, deadline - now))
