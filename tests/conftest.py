"""Shared pytest configuration for the torch_pjrt tests.

- Imports torch_pjrt explicitly (autoload does the same at ``import torch`` once the package is
  installed; the explicit import keeps the tests working from a plain checkout).
- Registers the ``slow`` marker. Slow tests still run by default; deselect with ``-m "not slow"``.
- Registers the ``long`` marker: tests outside CI's 20-minute budget (the slowest
  multi-process, cache and model-zoo runs) or needing extra installs (the TorchTitan run). ``bash scripts/test.sh`` leaves them out; ``bash scripts/test.sh --long``
  runs only them (results and runtimes: docs/distributed.md).
- ``fallbacks``: a fixture measuring CPU fallbacks during a test. It never skips anything; a test
  that claims "no fallback" calls ``fallbacks.assert_none()``, whose message names the ops that
  fell back (from the runtime's per-op counts).
- ``mode``: a fixture running a test once per eager mode (process default).
- ``grad_mismatches``: every parameter's gradient of a tpu model against its CPU twin (training
  tests compare gradients, not only losses: a loss can match while a gradient is wrong).
- ``metrics``/``delta``: torch.tpu.metrics() snapshots and what changed between two.
- ``fresh_dynamo``: a fixture resetting Dynamo (and its counters) around a test.
- ``run_python``: code in a fresh interpreter (registration, autoload and device counts are once
  per process).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap

# The persistent compile cache of a test session lives in its own directory (set before torch
# loads torch_pjrt), so results never depend on what earlier runs left in ~/.cache. Tests of
# the cache itself use directories of their own.
os.environ.setdefault("TORCH_PJRT_CACHE_DIR", tempfile.mkdtemp(prefix="torch_pjrt_test_cache_"))
# The same for PyTorch's compile caches, which torch.compile(backend="tpu") uses for
# AOTAutograd's entries (torch_pjrt/compile/backend.py, option aot_cache).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="torch_pjrt_test_inductor_"))

import pytest  # noqa: E402
import torch  # noqa: E402

import torch_pjrt  # noqa: E402,F401  (registers the "tpu" device)
from torch_pjrt import _C, _plugins  # noqa: E402

TPU = torch.device("tpu")


def pytest_runtest_logreport(report):
    """With TORCH_PJRT_FAIL_LOG set, each failure's report is appended to that file as it
    happens: scripts/gpu_check.sh's runs end at a time limit, before pytest's own summary."""
    path = os.environ.get("TORCH_PJRT_FAIL_LOG")
    if path and report.failed:
        with open(path, "a") as f:
            f.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext[-2500:]}\n")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: long-running test (runs by default; deselect with -m 'not slow')"
    )
    config.addinivalue_line(
        "markers", "long: outside CI (time budget, extra installs); bash scripts/test.sh --long runs these"
    )


def fallback_count() -> int:
    """Total CPU fallbacks executed in this process so far."""
    return int(_C.metrics()["cpu_fallbacks"])


def fallback_ops() -> dict:
    """Per-op counts of CPU fallbacks so far ({} when the runtime does not expose them)."""
    for source in (_C, torch.tpu):
        fn = getattr(source, "fallback_ops", None)
        if fn is not None:
            try:
                return dict(fn())
            except AttributeError:  # torch.tpu's wrapper over an extension built without it
                continue
    return {}


class FallbackCounter:
    """Counts CPU fallbacks from its creation (or the last ``reset``) on."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._start = fallback_count()
        self._start_ops = fallback_ops()

    @property
    def delta(self) -> int:
        return fallback_count() - self._start

    def new_ops(self) -> dict:
        """ops whose fallback count grew since the start, with the increase"""
        now = fallback_ops()
        return {k: v - self._start_ops.get(k, 0) for k, v in now.items()
                if v != self._start_ops.get(k, 0)}

    def assert_none(self, what: str = "") -> None:
        d = self.delta
        assert d == 0, (
            f"{d} CPU fallback(s){' during ' + what if what else ''}; ops that fell back: "
            f"{self.new_ops() or '(the runtime does not expose per-op counts)'}"
        )


@pytest.fixture
def fallbacks() -> FallbackCounter:
    """A FallbackCounter started at the beginning of the test."""
    return FallbackCounter()


@pytest.fixture(scope="session")
def tpu() -> torch.device:
    return TPU


def raised_by(fn, device):
    """The exception fn(device) raises, or None (error-parity tests compare CPU's with tpu's)."""
    try:
        fn(device)
    except Exception as e:  # noqa: BLE001 (the type is what is compared)
        return e
    return None


def on_tpu(args):
    """args with every tensor copied to tpu."""
    return [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args]


def like_cpu_with(compare, f, *args):
    """f on CPU tensors and on their tpu copies: where CPU raises, tpu raises the same type;
    else compare(tpu result, CPU result) for each tensor result (one, or a tuple / list), and
    other results are equal."""
    import warnings

    try:
        want = f(*args)
    except Exception as e:  # noqa: BLE001 (the type is what is compared)
        with pytest.raises(type(e)), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the fallback's warning, where CPU runs it
            f(*on_tpu(args))
            torch.tpu.synchronize()
        return
    got = f(*on_tpu(args))
    if isinstance(want, torch.Tensor):
        compare(got, want)
    elif isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            compare(g, w)
    else:
        assert type(got) is type(want) and got == want


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter with `env` added to this process's environment. A job
    that asks for several CPU-plugin devices is skipped under another plugin (one GPU has one
    device, whatever TORCH_PJRT_CPU_DEVICE_COUNT says)."""
    if "TORCH_PJRT_CPU_DEVICE_COUNT" in env and _plugins.resolve().name != "cpu":
        pytest.skip("several devices come from the CPU plugin (TORCH_PJRT_CPU_DEVICE_COUNT)")
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, env={**os.environ, **env}, timeout=300,
    )


def metrics() -> dict:
    """torch.tpu.metrics() as a plain dict."""
    return dict(torch.tpu.metrics())


def delta(before: dict, after: dict) -> dict:
    """The metrics that changed between two metrics() snapshots, by how much."""
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


@pytest.fixture
def fresh_dynamo():
    """Dynamo without earlier graphs before and after the test; its counters (which reset()
    keeps) cleared too. Compile test modules use it with pytest.mark.usefixtures."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    counters.clear()


def tie_groups(model: torch.nn.Module) -> list[list[str]]:
    """The names under which each shared parameter of `model` appears (groups of 2 or more)."""
    groups = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return sorted(sorted(g) for g in groups.values() if len(g) > 1)


EAGER_MODES = ("strict", "debug", "defer_and_fuse")


@pytest.fixture(params=EAGER_MODES)
def mode(request):
    """Runs the test once per eager mode, set as the process default (so autograd's worker
    thread runs the backward pass in it too); strict again afterwards."""
    torch.tpu.set_eager_mode(request.param)
    try:
        yield request.param
    finally:
        torch.tpu.set_eager_mode("strict")


def grad_mismatches(cpu_model: torch.nn.Module, tpu_model: torch.nn.Module,
                    rtol: float, atol: float) -> list[str]:
    """Every parameter's gradient of `tpu_model` against `cpu_model`'s, matched by name (tied
    parameters under each of their names): a gradient present on one side only, or one that
    differs, is a problem. Also checks that the two models share parameters alike (a tie that
    one side lost makes gradients differ, but saying so names the cause)."""
    cpu_params = list(cpu_model.named_parameters(remove_duplicate=False))
    tpu_params = list(tpu_model.named_parameters(remove_duplicate=False))
    problems = []
    if tie_groups(cpu_model) != tie_groups(tpu_model):
        problems.append(f"tied parameters differ: cpu {tie_groups(cpu_model)}, "
                        f"tpu {tie_groups(tpu_model)}")
    tpu_by_name = dict(tpu_params)
    for name, c in cpu_params:
        t = tpu_by_name.get(name)
        if t is None:
            problems.append(f"{name}: missing from the tpu model")
        elif (c.grad is None) != (t.grad is None):
            problems.append(f"{name}: gradient on {'tpu' if c.grad is None else 'cpu'} only")
        elif c.grad is not None:
            if t.grad.device != t.device:
                problems.append(f"{name}: gradient on {t.grad.device}, parameter on {t.device}")
                continue
            try:
                torch.testing.assert_close(t.grad.cpu(), c.grad, rtol=rtol, atol=atol)
            except AssertionError as e:
                problems.append(f"{name}: " + str(e).replace("\n", " ")[:300])
    return problems
