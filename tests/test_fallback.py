"""The CPU fallback for ops without a lowering: correct results, one warning per op, counted,
an error naming the op under TORCH_PJRT_CPU_FALLBACK=0, and a flush of the defer_and_fuse graph
before it (the CPU reads what the recorded ops wrote). The op is a test-only custom op with only
a CPU kernel, so it takes this path whatever aten ops gain lowerings. Each case runs in a fresh
process because the environment variable is read once per process."""
import os
import subprocess
import sys
import textwrap

DEFINE_OP = """
    import torch
    lib = torch.library.Library("pjrt_test", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CPU")
    twice = torch.ops.pjrt_test.twice
"""


def run_python(code: str, **env):
    e = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(DEFINE_OP) + textwrap.dedent(code)],
                          capture_output=True, text=True, env=e, timeout=300)


def test_fallback_runs_on_cpu_warns_once_and_counts():
    r = run_python("""
        import warnings
        x = torch.tensor([3.0, 1.0, 2.0])
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            before = torch.tpu.metrics()["cpu_fallbacks"]
            for _ in range(3):
                u = twice(x.to("tpu"))
            after = torch.tpu.metrics()["cpu_fallbacks"]
        assert u.device.type == "tpu", u.device
        assert torch.equal(u.cpu(), x * 2), u.cpu()
        msgs = [str(m.message) for m in w if "pjrt_test::twice" in str(m.message)]
        assert len(msgs) <= 1, msgs
        assert after - before == 3, (before, after)
        assert torch.tpu.fallback_ops().get("pjrt_test::twice") == 3, torch.tpu.fallback_ops()
        if msgs:
            print("python-warning")
        print("ok")
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")
    # one warning per op: a Python warning, or (custom ops are called without torch's Python
    # warning handler) one line on stderr
    printed = r.stderr.count("'pjrt_test::twice' is not lowered")
    assert printed + ("python-warning" in r.stdout) == 1, r.stderr


def test_fallback_disabled_raises_not_implemented_naming_the_op():
    r = run_python("""
        try:
            twice(torch.tensor([3.0, 1.0], device="tpu"))
        except NotImplementedError as e:
            assert "pjrt_test::twice" in str(e), e
            print("ok")
    """, TORCH_PJRT_CPU_FALLBACK="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")


def test_fallback_in_defer_mode_sees_recorded_ops():
    r = run_python("""
        torch.tpu.set_eager_mode("defer_and_fuse")
        x = torch.tensor([1.0, 2.0], device="tpu")
        y = x * 3                      # recorded, not run
        z = twice(y) + 1               # the fallback must read y's value
        assert torch.tpu._C._defer_pending_ops() >= 1
        assert z.cpu().tolist() == [7.0, 13.0], z.cpu()
        print("ok")
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")
