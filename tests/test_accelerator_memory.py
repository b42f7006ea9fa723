"""torch.accelerator / torch.tpu memory queries: callable at any time, with true figures.

The CPU plugin's buffers are host memory, so its device "memory" is the host's: total is the
physical memory, free what the kernel reports available (memory_info.c). The host (pinned)
allocator is PrivateUse1's at::HostAllocator; it caches nothing, so emptying its cache is a
no-op that must not crash (it used to segfault once any tpu tensor existed: no host allocator
was registered for the device type).
"""
import os

import pytest
import torch

from conftest import TPU, run_python


def test_empty_host_cache_after_device_use_does_not_crash():
    # A fresh process: the crash was a segfault, which would take pytest down with it.
    r = run_python("""
        import torch
        x = torch.randn(4, 4, device="tpu")
        (x @ x).sum().item()
        torch.accelerator.empty_host_cache()
        p = torch.ones(1000).pin_memory()
        torch.accelerator.empty_host_cache()
        assert p.is_pinned() and p.sum().item() == 1000.0
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stderr[-2000:])


def _host_total_and_available():
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGESIZE")
    with open("/proc/meminfo") as f:
        avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    return total, avail


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="reads the host's /proc/meminfo")
def test_get_memory_info_on_the_cpu_plugin_is_the_hosts_memory():
    if torch.tpu.get_device_properties(0).platform != "cpu":
        pytest.skip("the host-memory figures are the CPU plugin's")
    torch.ones(8, device=TPU).sum().item()
    for query in (torch.accelerator.get_memory_info, torch.tpu.mem_get_info,
                  lambda: torch.tpu.mem_get_info(0), lambda: torch.tpu.mem_get_info("tpu:0")):
        total, before = _host_total_and_available()
        free_b, total_b = query()
        _, after = _host_total_and_available()
        assert isinstance(free_b, int) and isinstance(total_b, int)
        assert total_b == total
        assert 0 < free_b <= total_b
        # the kernel's figure, read just before and after (other processes allocate meanwhile)
        slack = total // 20
        assert min(before, after) - slack <= free_b <= max(before, after) + slack
    assert torch.tpu.get_device_properties(0).total_memory == total


def test_memory_info_of_a_missing_device_raises_like_cuda():
    n = torch.tpu.device_count()
    with pytest.raises(RuntimeError):
        torch.accelerator.get_memory_info(n)
    with pytest.raises(AssertionError):  # torch.cuda.mem_get_info's "Invalid device id"
        torch.tpu.mem_get_info(n)


# --- a per-process budget (torch.tpu.set_per_process_memory_fraction) ---------------------------
# Its own interpreter: the budget is process-wide, and other tests running beside it in the same
# worker must not meet it.

def test_memory_fraction_oom_then_recovery():
    r = run_python("""
        import torch
        total = torch.tpu.get_device_properties(0).total_memory
        keep = torch.ones(1024, device="tpu")          # 4 KiB that must survive the OOM
        base = torch.tpu.memory_allocated()
        frac = (base + 64 * 2**20) / total              # room for 64 MiB more
        torch.tpu.set_per_process_memory_fraction(frac)
        assert torch.tpu.get_per_process_memory_fraction() == frac
        a = torch.empty(16 * 2**20, dtype=torch.uint8, device="tpu")   # 16 MiB: fits
        try:
            torch.empty(256 * 2**20, dtype=torch.uint8, device="tpu")  # 256 MiB: does not
        except torch.OutOfMemoryError as e:
            msg = str(e)
        else:
            raise SystemExit("no OutOfMemoryError")
        assert "Tried to allocate 256.00 MiB" in msg and "limit of" in msg, msg
        assert torch.tpu.memory_allocated() == base + 16 * 2**20  # the failed one counts nothing
        assert torch.tpu.memory_stats()["num_ooms"] == 1
        # an op whose output does not fit fails the same way and leaves its inputs intact
        big = torch.empty(40 * 2**20, dtype=torch.uint8, device="tpu")
        try:
            torch.cat([big, big])
        except torch.OutOfMemoryError:
            pass
        else:
            raise SystemExit("cat did not raise")
        assert keep.sum().item() == 1024.0
        # freeing makes room again; lifting the cap allows anything
        del a, big
        c = torch.empty(60 * 2**20, dtype=torch.uint8, device="tpu")
        del c
        torch.tpu.set_per_process_memory_fraction(1.0)
        d = torch.ones(128 * 2**20, dtype=torch.uint8, device="tpu")
        assert d.sum().item() == 128 * 2**20
        # CUDA's argument checks
        for bad, exc in ((2, TypeError), (1.5, ValueError), (-0.1, ValueError)):
            try:
                torch.tpu.set_per_process_memory_fraction(bad)
            except exc:
                pass
            else:
                raise SystemExit(f"{bad!r} accepted")
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stdout[-2000:],
                                                                   r.stderr[-3000:])


def test_memory_summary_and_stats():
    x = torch.ones(256, 256, device=TPU)
    st = torch.tpu.memory_stats()
    assert st["allocated_bytes.all.current"] == torch.tpu.memory_allocated() >= x.nbytes
    s = torch.tpu.memory_summary()
    assert isinstance(s, str) and "Allocated memory" in s and "Per-process limit" in s
    assert "Allocated memory" in torch.tpu.memory_summary(0, abbreviated=True)
    del x
