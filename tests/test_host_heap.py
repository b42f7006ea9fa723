"""The CPU plugin's heap policy (csrc/include/torch_pjrt/host_heap.h): large device buffers are
reused from the process heap instead of being fresh pages on every call, and
TORCH_PJRT_HOST_HEAP=system keeps glibc's defaults."""
import os
import subprocess
import sys

import pytest

_PROBE = """
import resource, torch, torch_pjrt
for _ in range(3):
    torch.zeros(64, 256, 768, device="tpu")  # 48 MiB: glibc would mmap it
torch.tpu.synchronize()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    z = torch.zeros(64, 256, 768, device="tpu")
    del z
torch.tpu.synchronize()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) // 5)
"""


def _faults_per_call(**env) -> int:
    out = subprocess.run([sys.executable, "-c", _PROBE], env={**os.environ, **env},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc only")
def test_large_buffers_reuse_the_heap_unless_system_is_asked():
    pages = 64 * 256 * 768 * 4 // 4096
    assert _faults_per_call() < pages // 10
    assert _faults_per_call(TORCH_PJRT_HOST_HEAP="system") > pages // 2
