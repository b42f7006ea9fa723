"""A plugin that is missing, not a PJRT plugin, of an incompatible C API version, or that fails
to create a client: `import torch` still works, torch.tpu.is_available() is False with the reason
in torch.tpu.diagnostics(), and the first tpu op raises one clear RuntimeError; never a crash.

The stub plugins are built here from tests/stub_plugin/stub_pjrt_plugin.c with the same
pjrt_c_api.h the runtime is built with (build/include, from the installed package)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from conftest import run_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUB = os.path.join(ROOT, "tests", "stub_plugin", "stub_pjrt_plugin.c")
INCLUDE = os.path.join(ROOT, "build", "include")

PROBE = """
    import json, torch
    out = {"available": torch.tpu.is_available(), "count": torch.tpu.device_count()}
    out["problems"] = torch.tpu.diagnostics().get("problems", {})
    try:
        torch.ones(2, device="tpu") + 1
        out["op"] = "ran"
    except RuntimeError as e:
        out["op"] = str(e)
    try:  # the same answer the second time, not a crash or a different error
        torch.zeros(1, device="tpu")
        out["op2"] = "ran"
    except RuntimeError as e:
        out["op2"] = str(e)
    print("RESULT" + json.dumps(out))
"""


def _build(tmp_path, name: str, *defines: str) -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not os.path.exists(os.path.join(INCLUDE, "pjrt_c_api.h")):
        pytest.fail("needs a C compiler and build/include/pjrt_c_api.h (make builds both)")
    so = str(tmp_path / f"{name}.so")
    subprocess.run([cc, "-shared", "-fPIC", "-std=c11", "-I", INCLUDE, *defines, STUB, "-o", so],
                   check=True, capture_output=True)
    return so


def _probe(plugin: str) -> dict:
    import json

    r = run_python(PROBE, TORCH_PJRT_PLUGIN=plugin)
    assert r.returncode == 0, f"process failed (rc {r.returncode}):\n{r.stderr[-3000:]}"
    line = next(l for l in r.stdout.splitlines() if l.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


def _check(out: dict, *words: str) -> None:
    assert out["available"] is False and out["count"] == 0, out
    assert out["op"] != "ran" and out["op2"] != "ran", out
    for w in words:
        assert w in out["op"], (w, out["op"])
    assert out["op2"] == out["op"], out


def test_missing_plugin_file(tmp_path):
    path = str(tmp_path / "no_such_plugin.so")
    _check(_probe(path), "existing file", path)


def test_library_without_get_pjrt_api(tmp_path):
    src = tmp_path / "not_a_plugin.c"
    src.write_text("int not_a_plugin(void) { return 0; }\n")
    so = str(tmp_path / "not_a_plugin.so")
    subprocess.run([shutil.which("cc") or "gcc", "-shared", "-fPIC", str(src), "-o", so],
                   check=True, capture_output=True)
    _check(_probe(so), "does not export GetPjrtApi")


def test_get_pjrt_api_returning_null(tmp_path):
    _check(_probe(_build(tmp_path, "null_api", "-DSTUB_NULL_API")), "returned NULL")


def test_incompatible_major_version(tmp_path):
    _check(_probe(_build(tmp_path, "major99", "-DSTUB_MAJOR=99")), "major version 99")


def test_too_old_minor_version(tmp_path):
    _check(_probe(_build(tmp_path, "minor10", "-DSTUB_MINOR=10")), "0.10", "older")


def test_client_creation_failure(tmp_path):
    out = _probe(_build(tmp_path, "refuses_client"))
    _check(out, "client creation refused")


def _probe_env(**env: str) -> dict:
    import json

    r = run_python(PROBE, **env)
    assert r.returncode == 0, f"process failed (rc {r.returncode}):\n{r.stderr[-3000:]}"
    line = next(l for l in r.stdout.splitlines() if l.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


def test_an_xla_flag_the_plugin_does_not_know_disables_the_device_instead_of_aborting(tmp_path):
    # the XLA plugin aborts the process on an unknown flag when its client starts; a child
    # process tries first, and the device is disabled with the plugin's own complaint
    out = _probe_env(XLA_FLAGS="--torch_pjrt_no_such_flag=1", TORCH_PJRT_CACHE_DIR=str(tmp_path))
    _check(out, "Unknown flag in XLA_FLAGS: --torch_pjrt_no_such_flag", "XLA_FLAGS")
    assert not (tmp_path / "flags-ok").exists() or not os.listdir(tmp_path / "flags-ok")


def test_accepted_xla_flags_are_checked_once_and_remembered(tmp_path):
    flags = "--xla_cpu_enable_fast_math=false"
    out = _probe_env(XLA_FLAGS=flags, TORCH_PJRT_CACHE_DIR=str(tmp_path))
    assert out["available"] is True and out["op"] == "ran" and out["op2"] == "ran", out
    assert len(os.listdir(tmp_path / "flags-ok")) == 1  # the verdict, keyed by plugin and flags
    out = _probe_env(XLA_FLAGS=flags, TORCH_PJRT_CACHE_DIR=str(tmp_path))
    assert out["op"] == "ran" and len(os.listdir(tmp_path / "flags-ok")) == 1
