"""The in-memory program cache stays within the process's memory-map budget
(csrc/runtime/cache.c): every loaded executable holds code mappings, and past the kernel's limit
(vm.max_map_count) the compiler's next mmap fails and the process dies (PyTorch's index_reduce
tests did, at 51,000 mappings). With a small budget (TORCH_PJRT_MAP_BUDGET) many distinct
programs evict older ones instead, results stay right, and the mappings stay near the budget."""
import sys

import pytest

from conftest import run_python

SCRIPT = """
import os, torch, torch_pjrt
def maps():
    return sum(1 for _ in open("/proc/self/maps"))
(torch.ones(1, device="tpu") + 1).cpu()
budget = maps() + 400
os.environ["TORCH_PJRT_MAP_BUDGET"] = str(budget)  # read at the cache's first check
peak = 0
for n in range(1, 300):
    x = torch.ones(n + 20000, device="tpu")  # above the size buckets: a program per size
    s = (x * 3).sum().item()
    assert s == 3 * (n + 20000), (n, s)
    peak = max(peak, maps())
m = torch.tpu.metrics()
print("RESULT", m["cache_map_evictions"], peak - budget)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts /proc/self/maps")
def test_many_programs_stay_within_the_map_budget(tmp_path):
    r = run_python(SCRIPT, TORCH_PJRT_CACHE_DIR=str(tmp_path / "cache"))
    assert r.returncode == 0, r.stderr[-3000:]
    evictions, over = map(int, [ln for ln in r.stdout.splitlines()
                                if ln.startswith("RESULT")][-1].split()[1:])
    assert evictions > 0
    # checked every 32 inserts, a few mappings each: never far above the budget
    assert over < 400, over
