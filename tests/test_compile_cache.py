"""The persistent compile cache (csrc/runtime/disk_cache.c), across real processes: a second
process loads instead of compiling, several processes share a directory safely, corrupted or
truncated entries are detected and replaced, the size bound evicts, and 0 disables it."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_pjrt

WORKLOAD = """
    import json, torch
    x = torch.arange(48, dtype=torch.float32).reshape(6, 8).to("tpu")
    y = ((x @ x.t()).softmax(-1) * 3 + x[:, :6].exp().log()).sum(0)
    values = y.cpu().tolist()
    m = torch.tpu.metrics()
    print(json.dumps({"values": values, "compiles": m["compiles"],
                      "stats": torch.tpu.cache_stats()}))
"""


def run(cache_dir, **env):
    e = dict(os.environ, TORCH_PJRT_CACHE_DIR=str(cache_dir), **env)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(WORKLOAD)], capture_output=True,
                       text=True, env=e, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def entries(cache_dir):
    return sorted(p for p in os.listdir(cache_dir) if p.endswith(".pjx"))


@pytest.fixture(scope="module")
def expected():
    import torch
    x = torch.arange(48, dtype=torch.float32).reshape(6, 8)
    return ((x @ x.t()).softmax(-1) * 3 + x[:, :6].exp().log()).sum(0).tolist()


def test_second_process_loads_instead_of_compiling(tmp_path, expected):
    first = run(tmp_path)
    assert first["stats"]["disk_cache_hits"] == 0
    assert first["stats"]["disk_cache_stores"] == first["compiles"] > 0
    assert len(entries(tmp_path)) == first["compiles"]
    second = run(tmp_path)
    assert second["compiles"] == 0
    assert second["stats"]["disk_cache_hits"] == first["compiles"]
    assert second["stats"]["disk_cache_misses"] == 0
    assert second["values"] == first["values"]
    assert second["values"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.long
def test_corrupted_and_truncated_entries_are_replaced(tmp_path, expected):
    first = run(tmp_path)
    files = entries(tmp_path)
    assert len(files) >= 2
    with open(tmp_path / files[0], "r+b") as f:  # flip bytes in the middle
        f.seek(os.path.getsize(tmp_path / files[0]) // 2)
        f.write(b"\xff\x00\xff\x00")
    with open(tmp_path / files[1], "r+b") as f:  # truncate
        f.truncate(os.path.getsize(tmp_path / files[1]) // 3)
    again = run(tmp_path)
    assert again["stats"]["disk_cache_corrupt_entries"] == 2
    assert again["compiles"] == 2 and again["stats"]["disk_cache_stores"] == 2
    assert again["values"] == first["values"]
    assert again["values"] == pytest.approx(expected, rel=1e-5)
    third = run(tmp_path)  # the replaced entries are whole again
    assert third["compiles"] == 0 and third["stats"]["disk_cache_corrupt_entries"] == 0


@pytest.mark.long
def test_concurrent_processes_share_one_directory(tmp_path, expected):
    e = dict(os.environ, TORCH_PJRT_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(WORKLOAD)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
             for _ in range(4)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    for r in results:
        assert r["values"] == pytest.approx(expected, rel=1e-5)
        assert r["stats"]["disk_cache_corrupt_entries"] == 0
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp")]  # no leftovers
    after = run(tmp_path)
    assert after["compiles"] == 0 and after["stats"]["disk_cache_misses"] == 0


@pytest.mark.long
def test_size_bound_evicts_least_recently_used(tmp_path):
    first = run(tmp_path, TORCH_PJRT_CACHE_MAX_BYTES="12000")
    assert first["stats"]["disk_cache_evictions"] > 0
    total = sum(os.path.getsize(tmp_path / p) for p in entries(tmp_path))
    assert total <= 12000


@pytest.mark.long
def test_zero_disables(tmp_path):
    r = run("0")
    assert r["stats"]["dir"] == ""
    assert r["stats"]["disk_cache_stores"] == 0 and r["stats"]["disk_cache_hits"] == 0


def test_keys_name_the_plugin_and_our_own_sources():
    """Every program key starts with the runtime identity: the plugin's versions and file, a
    digest of torch_pjrt's sources, so a changed lowering never reuses a stored program, and
    one of the compiler flags (XLA_FLAGS, LIBTPU_INIT_ARGS), which change what a program
    compiles to (test_op_boundary_rounding.py runs two flag settings over one cache), and
    whether the native kernels are registered (programs name their custom calls)."""
    import re

    ident = torch.tpu._C.identity()
    assert re.search(r"\|code[0-9a-f]{16}\|flags[0-9a-f]{16}\|native[01]$", ident), ident
    assert ident.startswith(torch_pjrt._C.platform_name()), ident


@pytest.mark.long
def test_memory_cache_is_bounded_and_evicted_programs_reload(tmp_path):
    """With TORCH_PJRT_PROGRAM_CACHE_MAX=16, 40 distinct programs evict the least recently used
    from memory (a process compiling thousands of programs would otherwise run out of code
    mappings); using an evicted one again loads it from the persistent cache, same values."""
    code = """
        import json, torch
        xs = [torch.arange(n, dtype=torch.float32) for n in range(1, 41)]
        first = [(x.to("tpu") * 3 + 1).cpu() for x in xs]
        m0 = torch.tpu.metrics()
        again = [(x.to("tpu") * 3 + 1).cpu() for x in xs[:8]]
        m1 = torch.tpu.metrics()
        ok = all(torch.equal(a, x * 3 + 1) for a, x in zip(first + again, xs + xs[:8]))
        print(json.dumps({"ok": ok, "compiles": m1["compiles"] - m0["compiles"],
                          "disk_hits": m1["disk_cache_hits"] - m0["disk_cache_hits"]}))
    """
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=str(tmp_path), TORCH_PJRT_PROGRAM_CACHE_MAX="16")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["ok"]
    assert out["compiles"] == 0          # nothing compiled twice
    assert out["disk_hits"] >= 8, out    # the early programs had left memory
