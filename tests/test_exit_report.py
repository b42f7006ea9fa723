"""TORCH_PJRT_EXIT_REPORT=1 (torch_pjrt/exit_report.py): one parsable line per process that
used the device, none from one that did not."""
import os
import subprocess
import sys

from torch_pjrt.exit_report import parse


def _run(code: str) -> str:
    env = {**os.environ, "TORCH_PJRT_EXIT_REPORT": "1", "RANK": "3"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stderr


def test_report_of_a_process_that_used_the_device():
    reports = parse(_run("import torch; x = torch.ones(4, device='tpu'); (x + 1).sum().item()"))
    assert len(reports) == 1
    r = reports[0]
    assert r["rank"] == 3 and r["fallback_ops"] == {}
    assert r["metrics"]["executions"] >= 1 and r["metrics"]["transfers_to_host"] >= 1


def test_no_report_without_the_device():
    assert parse(_run("import torch; torch.ones(2) + 1")) == []
