"""The CPU fallback for ops without a lowering: correct results, one warning per op, counted,
and an error naming the op under TORCH_PJRT_CPU_FALLBACK=0. torch.unique (aten::_unique2) has
neither a lowering nor a decomposition, so it takes this path. Each case runs in a fresh process
because the environment variable is read once per process."""
import os
import subprocess
import sys
import textwrap


def run_python(code: str, **env):
    e = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=e, timeout=300)


def test_fallback_runs_on_cpu_warns_once_and_counts():
    r = run_python("""
        import warnings, torch
        x = torch.tensor([3, 1, 3, 2, 1])
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            before = torch.tpu.metrics()["cpu_fallbacks"]
            for _ in range(3):
                u = torch.unique(x.to("tpu"))
            after = torch.tpu.metrics()["cpu_fallbacks"]
        assert u.device.type == "tpu", u.device
        assert torch.equal(u.cpu(), torch.unique(x)), u.cpu()
        msgs = [str(m.message) for m in w if "_unique2" in str(m.message)]
        assert len(msgs) == 1, msgs
        assert after - before == 3, (before, after)
        assert torch.tpu.fallback_ops().get("aten::_unique2") == 3, torch.tpu.fallback_ops()
        print("ok")
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")


def test_fallback_disabled_raises_not_implemented_naming_the_op():
    r = run_python("""
        import torch
        try:
            torch.unique(torch.tensor([3, 1, 3], device="tpu"))
        except NotImplementedError as e:
            assert "aten::_unique2" in str(e), e
            print("ok")
    """, TORCH_PJRT_CPU_FALLBACK="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")
