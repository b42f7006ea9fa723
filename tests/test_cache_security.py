"""The persistent compile cache's trust rules (csrc/include/torch_pjrt/disk_cache.h), across
real processes, each with its own TORCH_PJRT_CACHE_DIR: files are private by default; entries
in a directory others can write, entries of other users and symlinks are refused (a warning
naming the file, the program compiled instead) unless TORCH_PJRT_CACHE_SHARED=1;
TORCH_PJRT_CACHE_KEY tags entries with HMAC-SHA256 and refuses entries without a valid tag;
TORCH_PJRT_CACHE_READONLY=1 writes nothing."""
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest

# the same workload and helpers as the cache's own tests
from test_compile_cache import WORKLOAD, entries, expected  # noqa: F401 (expected: a fixture)

KNOBS = ("TORCH_PJRT_CACHE_SHARED", "TORCH_PJRT_CACHE_KEY", "TORCH_PJRT_CACHE_READONLY")


def run(cache_dir, **env):
    """One child process over cache_dir: its result (values, compiles, cache_stats) and its
    stderr (where Python shows the cache's warnings)."""
    base = {k: v for k, v in os.environ.items() if k not in KNOBS}
    e = dict(base, TORCH_PJRT_CACHE_DIR=str(cache_dir), **env)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(WORKLOAD)], capture_output=True,
                       text=True, env=e, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["stderr"] = r.stderr
    return out


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A cache directory filled by one process (default settings), copied by the tests that
    change it; and that process's result."""
    d = tmp_path_factory.mktemp("warm") / "cache"
    first = run(d)
    assert first["compiles"] > 0 and first["stats"]["disk_cache_stores"] == first["compiles"]
    return d, first


def copy_of(warm, tmp_path):
    d = tmp_path / "cache"
    shutil.copytree(warm[0], d)
    os.chmod(d, 0o700)
    return d


def assert_refused_all(r, first, expected, files, cache_dir):
    """Every entry refused with a warning naming it; everything compiled again; right values."""
    assert r["stats"]["disk_cache_hits"] == 0
    assert r["compiles"] == first["compiles"]
    assert r["stats"]["disk_cache_refused_entries"] == len(files)
    for f in files:
        assert os.path.join(str(cache_dir), f) in r["stderr"], r["stderr"]
    assert str(cache_dir) in r["stats"]["last_warning"]
    assert r["values"] == pytest.approx(expected, rel=1e-5)


def test_second_process_loads_and_files_are_private(tmp_path, expected):
    d = tmp_path / "a" / "cache"  # both levels created by the cache
    first = run(d, TORCH_PJRT_CACHE_KEY="k1")
    assert first["stats"]["keyed"] and not first["stats"]["shared"]
    for p in (d, d.parent):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o700, oct(os.stat(p).st_mode)
    files = entries(d)
    assert len(files) == first["compiles"] > 0
    for f in files:
        assert stat.S_IMODE(os.stat(d / f).st_mode) == 0o600
    second = run(d, TORCH_PJRT_CACHE_KEY="k1")
    assert second["compiles"] == 0
    assert second["stats"]["disk_cache_hits"] == first["compiles"]
    assert second["stats"]["disk_cache_refused_entries"] == 0
    assert second["values"] == pytest.approx(expected, rel=1e-5)
    # tagged entries still load without a key (no key: no integrity policy)
    third = run(d)
    assert third["compiles"] == 0 and third["stats"]["disk_cache_refused_entries"] == 0


@pytest.mark.parametrize("mode", [0o777, 0o770])
def test_directory_writable_by_others_is_refused_unless_shared(warm, tmp_path, expected, mode):
    d = copy_of(warm, tmp_path)
    files = entries(d)
    os.chmod(d, mode)
    r = run(d)
    assert_refused_all(r, warm[1], expected, files, d)
    assert r["stats"]["disk_cache_stores"] == 0  # nothing stored where it would be refused
    assert entries(d) == files
    ok = run(d, TORCH_PJRT_CACHE_SHARED="1")
    assert ok["stats"]["shared"]
    assert ok["compiles"] == 0 and ok["stats"]["disk_cache_hits"] == len(files)
    assert ok["stats"]["disk_cache_refused_entries"] == 0
    assert ok["values"] == pytest.approx(expected, rel=1e-5)


def test_entries_of_another_user_are_refused_unless_shared(warm, tmp_path, expected):
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root; these tests do not run as root")
    d = copy_of(warm, tmp_path)
    files = entries(d)
    for f in files:
        os.chown(d / f, 65534, 65534)
    r = run(d)
    assert_refused_all(r, warm[1], expected, files, d)
    assert "owned by uid 65534" in r["stderr"]
    ok = run(d, TORCH_PJRT_CACHE_SHARED="1")
    assert ok["compiles"] == 0 and ok["stats"]["disk_cache_hits"] == len(files)


def test_symlinked_and_group_writable_entries_are_refused(warm, tmp_path, expected):
    d = copy_of(warm, tmp_path)
    files = entries(d)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.move(str(d / files[0]), elsewhere / files[0])
    os.symlink(elsewhere / files[0], d / files[0])
    for f in files[1:]:
        os.chmod(d / f, 0o620)
    r = run(d)
    assert_refused_all(r, warm[1], expected, files, d)
    assert "symbolic link" in r["stderr"]


def test_tampered_entry_with_a_key_is_refused_and_replaced(tmp_path, expected):
    d = tmp_path / "cache"
    first = run(d, TORCH_PJRT_CACHE_KEY="secret")
    files = entries(d)
    victim = d / files[0]
    with open(victim, "r+b") as f:  # one byte of the serialized program, near its end
        f.seek(os.path.getsize(victim) - 7)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x40]))
    r = run(d, TORCH_PJRT_CACHE_KEY="secret")
    assert r["stats"]["disk_cache_refused_entries"] == 1
    assert str(victim) in r["stderr"] and "integrity tag" in r["stderr"]
    assert r["compiles"] == 1 and r["stats"]["disk_cache_hits"] == len(files) - 1
    assert r["stats"]["disk_cache_corrupt_entries"] == 0
    assert r["values"] == first["values"]
    assert r["values"] == pytest.approx(expected, rel=1e-5)
    again = run(d, TORCH_PJRT_CACHE_KEY="secret")  # the recompiled program replaced it
    assert again["compiles"] == 0 and again["stats"]["disk_cache_refused_entries"] == 0


def test_wrong_key_is_refused(tmp_path, expected):
    d = tmp_path / "cache"
    first = run(d, TORCH_PJRT_CACHE_KEY="right")
    files = entries(d)
    r = run(d, TORCH_PJRT_CACHE_KEY="wrong")
    assert_refused_all(r, first, expected, files, d)


def test_untagged_entries_are_refused_when_a_key_is_set(warm, tmp_path, expected):
    d = copy_of(warm, tmp_path)  # written without a key
    files = entries(d)
    r = run(d, TORCH_PJRT_CACHE_KEY="secret")
    assert_refused_all(r, warm[1], expected, files, d)
    assert "no integrity tag" in r["stderr"]


def test_readonly_writes_nothing(warm, tmp_path, expected):
    missing = tmp_path / "missing"
    r = run(missing, TORCH_PJRT_CACHE_READONLY="1")
    assert not missing.exists()  # not created
    assert r["values"] == pytest.approx(expected, rel=1e-5)
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    r = run(empty, TORCH_PJRT_CACHE_READONLY="1")
    assert r["stats"]["readonly"] and r["stats"]["disk_cache_stores"] == 0
    assert os.listdir(empty) == []
    d = copy_of(warm, tmp_path)
    files = entries(d)
    with open(d / files[0], "r+b") as f:  # damaged: a writer would remove it; this one not
        f.truncate(os.path.getsize(d / files[0]) // 2)
    before = {f: (os.stat(d / f).st_mtime_ns, os.path.getsize(d / f)) for f in files}
    r = run(d, TORCH_PJRT_CACHE_READONLY="1", TORCH_PJRT_CACHE_MAX_BYTES="1")
    assert r["stats"]["disk_cache_hits"] == len(files) - 1 and r["compiles"] == 1
    assert r["stats"]["disk_cache_corrupt_entries"] == 1
    assert r["stats"]["disk_cache_stores"] == 0 and r["stats"]["disk_cache_evictions"] == 0
    assert sorted(os.listdir(d)) == files  # nothing added, removed or left behind
    assert {f: (os.stat(d / f).st_mtime_ns, os.path.getsize(d / f)) for f in files} == before


def test_config_reads_the_trust_settings():
    from torch_pjrt import config

    c = config.load({"TORCH_PJRT_CACHE_SHARED": "1", "TORCH_PJRT_CACHE_READONLY": "1",
                     "TORCH_PJRT_CACHE_KEY": "s3cret"})
    assert c.cache_shared and c.cache_readonly and c.cache_key == b"s3cret"
    assert "s3cret" not in repr(c)  # the secret is never shown
    d = config.load({})
    assert not d.cache_shared and not d.cache_readonly and d.cache_key == b""
