"""Eager modes: the API (process default, thread-local override, environment), Debug mode's
synchronous execution and its CPU-identical errors for out-of-range indices, and training in
Debug mode matching CPU."""
import os
import subprocess
import sys
import threading

import pytest
import torch

from conftest import grad_mismatches

TPU = torch.device("tpu")


def test_api_default_set_get_and_thread_local_override():
    assert torch.tpu.get_eager_mode() == "strict"
    seen = {}
    with torch.tpu.eager_mode("debug"):
        assert torch.tpu.get_eager_mode() == "debug"
        t = threading.Thread(target=lambda: seen.setdefault("other", torch.tpu.get_eager_mode()))
        t.start()
        t.join()
    assert seen["other"] == "strict"  # the override is thread-local
    assert torch.tpu.get_eager_mode() == "strict"
    torch.tpu.set_eager_mode("debug")
    try:
        assert torch.tpu.get_eager_mode() == "debug"
    finally:
        torch.tpu.set_eager_mode("strict")
    with pytest.raises(ValueError):
        torch.tpu.set_eager_mode("fast")
    torch.tpu.set_eager_mode("defer_and_fuse")
    try:
        assert torch.tpu.get_eager_mode() == "defer_and_fuse"
    finally:
        torch.tpu.set_eager_mode("strict")


@pytest.mark.parametrize("env,mode", [({"TORCH_TPU_LAUNCH_BLOCKING": "1"}, "debug"),
                                      ({"TORCH_PJRT_EAGER_MODE": "debug"}, "debug"),
                                      ({"TORCH_TPU_DEFER_AND_FUSE": "1"}, "defer_and_fuse"),
                                      ({"TORCH_PJRT_EAGER_MODE": "defer_and_fuse"},
                                       "defer_and_fuse"),
                                      ({"TORCH_PJRT_EAGER_MODE": "strict",
                                        "TORCH_TPU_LAUNCH_BLOCKING": "1"}, "strict")])
def test_environment_selects_the_initial_mode(env, mode):
    r = subprocess.run([sys.executable, "-c", "import torch; print(torch.tpu.get_eager_mode())"],
                       capture_output=True, text=True, env=dict(os.environ, **env), timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == mode


BAD_INDEX_CASES = {
    "gather": lambda d: torch.arange(4.0, device=d).gather(0, torch.tensor([1, 7], device=d)),
    "index": lambda d: torch.arange(4.0, device=d)[torch.tensor([1, 7], device=d)],
    "index_select": lambda d: torch.arange(4.0, device=d).index_select(0, torch.tensor([-9], device=d)),
    "embedding": lambda d: torch.nn.functional.embedding(torch.tensor([4], device=d),
                                                         torch.ones(4, 2, device=d)),
    "scatter": lambda d: torch.zeros(3, device=d).scatter_(0, torch.tensor([3], device=d),
                                                          torch.ones(1, device=d)),
    "index_put": lambda d: torch.zeros(3, device=d).index_put_((torch.tensor([5], device=d),),
                                                               torch.ones(1, device=d)),
    "cross_entropy_target": lambda d: torch.nn.functional.cross_entropy(
        torch.zeros(2, 3, device=d), torch.tensor([0, 3], device=d)),
}


@pytest.mark.parametrize("name", list(BAD_INDEX_CASES))
def test_debug_mode_raises_cpus_exception_for_bad_indices(name):
    fn = BAD_INDEX_CASES[name]
    with pytest.raises(Exception) as cpu:
        fn("cpu")
    with torch.tpu.eager_mode("debug"):
        with pytest.raises(Exception) as tpu:
            fn(TPU)
    assert tpu.type is cpu.type
    assert str(cpu.value).splitlines()[0] in str(tpu.value)


def test_debug_mode_is_synchronous():
    x = torch.randn(256, 256, device=TPU)
    with torch.tpu.eager_mode("debug"):
        for _ in range(5):
            x = x @ x / 256
        assert torch.tpu.pending_executions() == 0


def test_training_in_debug_mode_matches_cpu():
    from torch_pjrt._models import MLP, init_weights

    cpu = init_weights(MLP(), seed=3)
    dev = init_weights(MLP(), seed=3).to(TPU)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (cpu, dev)]
    g = torch.Generator().manual_seed(0)
    with torch.tpu.eager_mode("debug"):
        for step in range(10):
            x = torch.randn(16, 32, generator=g)
            y = torch.randint(0, 10, (16,), generator=g)
            losses = []
            for m, o, dv in ((cpu, opts[0], "cpu"), (dev, opts[1], TPU)):
                o.zero_grad()
                loss = torch.nn.functional.cross_entropy(m(x.to(dv)), y.to(dv))
                loss.backward()
                losses.append(loss.item())
            assert losses[1] == pytest.approx(losses[0], rel=1e-5 if step == 0 else 1e-3)
            tol = dict(rtol=1e-4, atol=1e-5) if step == 0 else dict(rtol=1e-3, atol=1e-4)
            assert not grad_mismatches(cpu, dev, **tol), (step, grad_mismatches(cpu, dev, **tol))
            for o in opts:
                o.step()


def test_check_nan_names_the_first_op_producing_nan_or_inf():
    code = """
import torch
x = torch.tensor([1.0, 0.0], device="tpu")
y = x * 2            # finite: passes the check
try:
    (y.log() * 3).sum()
except RuntimeError as e:
    print(str(e).splitlines()[0])
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, TORCH_PJRT_CHECK_NAN="1"), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "TORCH_PJRT_CHECK_NAN" in r.stdout and "aten::log" in r.stdout, r.stdout
    assert "at <string>:6" in r.stdout, r.stdout  # the Python line that ran the op
