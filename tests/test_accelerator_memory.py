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
