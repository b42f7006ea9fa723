"""The PJRT client's key-value store bridged from a c10d Store (issue 36 item 3;
csrc/bridge/kv_store_bridge.cpp over csrc/runtime/kv_store.c): PJRT's kv callbacks, called as a
plugin calls them at PJRT_Client_Create, read and write the c10d store under the prefix; a get
waits for a value another thread (or process) sets later, times out with TimeoutError, a
try_get of a missing key is a KeyError; the runtime takes the store only before it starts.
(No plugin here uses the store: the CPU plugin's client is one process's. tests/c/test_kv_store.c
checks the callbacks' PJRT error codes.)"""
import datetime
import multiprocessing
import os
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist

import torch_pjrt  # noqa: F401
from torch_pjrt.device import _C


def test_round_trip_under_the_prefix():
    store = dist.HashStore()
    kv = _C._KvStoreBridge(store, "torch_pjrt/test/")
    kv.put("topology", b"2x2\x00x")  # bytes, a zero among them
    assert store.get("torch_pjrt/test/topology") == b"2x2\x00x"
    assert kv.get("topology", 1000) == b"2x2\x00x"
    assert kv.try_get("topology") == b"2x2\x00x"
    store.set("torch_pjrt/test/from_c10d", b"v")
    assert kv.get("from_c10d", 1000) == b"v"
    with pytest.raises(ValueError, match="prefix longer"):
        _C._KvStoreBridge(store, "p" * 200)


def test_missing_keys():
    kv = _C._KvStoreBridge(dist.HashStore(), "torch_pjrt/test/")
    with pytest.raises(KeyError, match="torch_pjrt/test/absent"):
        kv.try_get("absent")
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="not set within the timeout"):
        kv.get("absent", 100)
    assert time.monotonic() - t0 < 10


def test_get_waits_for_a_later_set():
    store = dist.HashStore()
    kv = _C._KvStoreBridge(store, "p/")
    setter = threading.Timer(0.2, lambda: store.set("p/late", b"arrived"))
    setter.start()
    try:
        assert kv.get("late", 10000) == b"arrived"
    finally:
        setter.join()


def _tcp_peer(port, ready):
    store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=30))
    ready.wait(30)
    store.set("torch_pjrt/peer", b"from the other process")


def test_across_processes_over_a_tcp_store():
    """Two processes meet through a TCPStore, as torchrun ranks do: one process's put is the
    other's get."""
    store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=30),
                          wait_for_workers=False)
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    peer = ctx.Process(target=_tcp_peer, args=(store.port, ready))
    peer.start()
    try:
        ready.set()
        kv = _C._KvStoreBridge(store, "torch_pjrt/")
        assert kv.get("peer", 30000) == b"from the other process"
        kv.put("back", b"ok")
        assert store.get("torch_pjrt/back") == b"ok"
    finally:
        peer.join(60)
    assert peer.exitcode == 0


def test_the_runtime_takes_the_store_only_before_it_starts():
    torch.ones(1, device="tpu").cpu()  # this process's runtime exists
    with pytest.raises(RuntimeError, match="already initialized"):
        torch_pjrt.distributed.use_kv_store(dist.HashStore())
    # a fresh process: the client is created with the store, and the device works
    code = ("import torch, torch.distributed as dist, torch_pjrt\n"
            "torch_pjrt.distributed.use_kv_store(dist.HashStore())\n"
            "print((torch.ones(2, device='tpu') + 1).cpu().tolist())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env={**os.environ})
    assert r.returncode == 0 and "[2.0, 2.0]" in r.stdout, r.stderr[-2000:]
