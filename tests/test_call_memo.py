"""The call memo (csrc/bridge/call_memo.h): a repeated eager call runs from what its first call
found out. Each case runs an op several times with new values (the memo's path from the second
call on, checked through the memo_hits counter) and compares every result with CPU: values,
dtypes, shapes, strides, and which tensor object comes back."""
import subprocess
import sys
import threading

import pytest
import torch

import torch_pjrt  # noqa: F401
from torch_pjrt import _C

TPU = torch.device("tpu")


def hits():
    return torch.tpu.metrics()["memo_hits"]


def same(tpu, cpu):
    if isinstance(cpu, torch.Tensor):
        assert tpu.device.type == "tpu"
        assert tpu.dtype == cpu.dtype and tpu.shape == cpu.shape, (tpu, cpu)
        assert tpu.stride() == cpu.stride(), (tpu.stride(), cpu.stride())
        torch.testing.assert_close(tpu.cpu(), cpu, equal_nan=True)
    elif isinstance(cpu, (tuple, list)):
        for a, b in zip(tpu, cpu):
            same(a, b)
    else:
        assert tpu == cpu


def inputs(seed, dev):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(6, 8, generator=g)
    ints = torch.randint(-5, 5, (6, 8), generator=g)
    t = {"a": base, "b": torch.randn(6, 8, generator=g), "row": torch.randn(8, generator=g),
         "i": ints, "m": ints > 0, "sq": torch.randn(8, 8, generator=g)}
    t = {k: v.to(dev) for k, v in t.items()}
    t["aT"] = t["sq"].t()                       # transposed view
    t["off"] = t["a"][2:, 1:7]                  # view with an offset
    t["as_i32"] = t["a"].view(torch.int32)      # another element type over the same storage
    return t


CASES = {
    "add": lambda t: t["a"] + t["b"],
    "add_alpha": lambda t: torch.add(t["a"], t["b"], alpha=2.5),
    "mul_scalar": lambda t: t["a"] * 0.5,
    "broadcast": lambda t: t["a"] - t["row"],
    "same_tensor_twice": lambda t: t["a"] * t["a"],
    "transposed": lambda t: t["aT"] + t["sq"],
    "offset_view": lambda t: t["off"].exp(),
    "int": lambda t: t["i"] * 3 + t["i"],
    "bool": lambda t: t["m"] & (t["i"] < 2),
    "where": lambda t: torch.where(t["m"], t["a"], t["b"]),
    "reduce": lambda t: t["a"].sum(dim=1, keepdim=True),
    "matmul": lambda t: t["a"] @ t["sq"],
    "softmax": lambda t: torch.softmax(t["a"], dim=-1),
    "two_outputs": lambda t: torch.max(t["a"], dim=1),
    "bitcast_view": lambda t: t["as_i32"] + 1,
    "cpu_scalar_tensor": lambda t: t["a"] * torch.tensor(1.5),
}


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_repeated_calls_match_cpu(name, mode):
    fn = CASES[name]
    with torch.tpu.eager_mode(mode):
        first = hits()
        for seed in range(4):
            same(fn(inputs(seed, TPU)), fn(inputs(seed, "cpu")))
        assert hits() > first, "the repeated calls did not run from the memo"


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_in_place_and_out_return_their_tensor(mode):
    with torch.tpu.eager_mode(mode):
        for seed in range(3):
            t, c = inputs(seed, TPU), inputs(seed, "cpu")
            r = t["a"].mul_(2.0)
            assert r is t["a"]
            c["a"].mul_(2.0)
            r = t["a"].add_(t["b"])
            c["a"].add_(c["b"])
            assert r is t["a"]
            out = torch.empty(6, 8, device=TPU)
            r = torch.mul(t["a"], t["b"], out=out)
            assert r is out
            same(out, c["a"] * c["b"])
            same(t["a"], c["a"])
            # a write through a view reaches its base
            t["off"].add_(1.0)
            c["off"].add_(1.0)
            same(t["a"], c["a"])


def test_out_of_the_wrong_shape_is_resized_every_time():
    for _ in range(3):
        a, b = torch.randn(4, 5), torch.randn(4, 5)
        out = torch.empty(2, device=TPU)
        torch.add(a.to(TPU), b.to(TPU), out=out)
        same(out, a + b)


def test_scalar_values_are_not_baked_in():
    x = torch.randn(5, 5)
    xt = x.to(TPU)
    for s in [0.5, 2.0, -3.0, 0.5, 7.25]:
        same(xt * s, x * s)
        same(xt * torch.tensor(s), x * torch.tensor(s))
        same(xt + int(s), x + int(s))


def test_memo_off_takes_the_full_path():
    a = torch.randn(3, 3)
    at = a.to(TPU)
    at + at
    _C._set_call_memo(False)
    try:
        before = hits()
        for _ in range(3):
            same(at + at, a + a)
        assert hits() == before
    finally:
        _C._set_call_memo(True)


def test_threads_get_cpu_results():
    errors = []

    def work(seed):
        try:
            for s in range(20):
                t, c = inputs(seed * 100 + s, TPU), inputs(seed * 100 + s, "cpu")
                same(torch.tanh(t["a"] * 0.5 + t["b"]), torch.tanh(c["a"] * 0.5 + c["b"]))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors


def test_training_step_gradients_match_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    tpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    tpu.load_state_dict(cpu.state_dict())
    tpu.to(TPU)
    opt_c = torch.optim.SGD(cpu.parameters(), lr=0.1)
    opt_t = torch.optim.SGD(tpu.parameters(), lr=0.1)
    for step in range(4):
        x, y = torch.randn(5, 8), torch.randn(5, 4)
        for model, opt, dev in ((cpu, opt_c, "cpu"), (tpu, opt_t, TPU)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x.to(dev)), y.to(dev)).backward()
        for pc, pt in zip(cpu.parameters(), tpu.parameters()):
            torch.testing.assert_close(pt.grad.cpu(), pc.grad, rtol=1e-4, atol=1e-5)
        opt_c.step()
        opt_t.step()
        for pc, pt in zip(cpu.parameters(), tpu.parameters()):
            torch.testing.assert_close(pt.detach().cpu(), pc.detach(), rtol=1e-4, atol=1e-5)


def test_evicted_programs_are_rebuilt():
    # A memory cache of 16 programs: earlier memos' programs are evicted by later shapes, and
    # their next calls must still give CPU's results (the memo finds no program, the full path
    # runs and makes a new memo).
    code = """
import torch, torch_pjrt
for rnd in range(3):
    for n in range(1, 40):
        for _ in range(2):  # the second call runs from the memo while its program is cached
            a = torch.randn(n, 3)
            r = (a.to('tpu') * 2.0 + 1.0).cpu()
            torch.testing.assert_close(r, a * 2.0 + 1.0)
m = torch.tpu.metrics()
assert m['memo_hits'] > 0, m
print('ok')
"""
    env = {**__import__("os").environ, "TORCH_PJRT_PROGRAM_CACHE_MAX": "16"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_index_errors_name_the_line_of_each_memoized_call(mode):
    import inspect

    w = torch.randn(10, 4, device=TPU)
    good = torch.tensor([1, 2], device=TPU)
    with torch.tpu.eager_mode(mode):
        for _ in range(3):
            torch.nn.functional.embedding(good, w)
        torch.tpu.synchronize()
        before = hits()
        torch.nn.functional.embedding(torch.tensor([1, 12], device=TPU), w)
        line = inspect.currentframe().f_lineno - 1
        assert hits() > before  # the bad call ran from the memo
        with pytest.raises(IndexError) as e:
            torch.tpu.synchronize()
    assert f"test_call_memo.py:{line}" in str(e.value), str(e.value)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_foreach_optimizer_steps_match_cpu(mode):
    torch.manual_seed(1)
    params_c = [torch.randn(5, 3), torch.randn(7), torch.randn(2, 2, 2)]
    params_t = [p.clone().to(TPU).requires_grad_() for p in params_c]
    params_c = [p.requires_grad_() for p in params_c]
    opt_c = torch.optim.AdamW(params_c, lr=0.01, foreach=True)
    opt_t = torch.optim.AdamW(params_t, lr=0.01, foreach=True)
    with torch.tpu.eager_mode(mode):
        before = hits()
        for step in range(4):
            grads = [torch.randn_like(p) for p in params_c]
            for p, g in zip(params_c, grads):
                p.grad = g
            for p, g in zip(params_t, grads):
                p.grad = g.to(TPU)
            opt_c.step()
            opt_t.step()
        for pc, pt in zip(params_c, params_t):
            torch.testing.assert_close(pt.detach().cpu(), pc.detach(), rtol=1e-5, atol=1e-6)
        assert hits() > before


def test_symint_arguments_are_memoized():
    for k in range(3):
        a = torch.randn(6, 6)
        same(torch.tril(a.to(TPU), diagonal=1), torch.tril(a, diagonal=1))
    before = hits()
    same(torch.tril(a.to(TPU), diagonal=1), torch.tril(a, diagonal=1))
    assert hits() > before


def test_deterministic_algorithms_alert_after_a_memoized_call():
    """torch.use_deterministic_algorithms is part of a memo's signature: put_ without
    accumulate alerts as on CPU also when the same call ran (and was memoized) before."""
    a = torch.randn(10, device="tpu")
    i = torch.tensor([0, 0], device="tpu")
    v = torch.tensor([0.0, 1.0], device="tpu")
    for _ in range(3):  # memoized
        a.put_(i, v)
        a.put(i, v)
    prior = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        for f in (torch.Tensor.put, torch.Tensor.put_):
            with pytest.raises(RuntimeError, match="put_ does not have a deterministic"):
                f(a, i, v, accumulate=False)
        a.put_(i, v, accumulate=True)  # deterministic: runs
        torch.use_deterministic_algorithms(True, warn_only=True)
        for _ in range(3):  # every call warns, as on CPU (put's composite calls put_ too)
            for f in (torch.Tensor.put, torch.Tensor.put_):
                with pytest.warns(UserWarning, match="put_ does not have a deterministic"):
                    f(a, i, v)
    finally:
        torch.use_deterministic_algorithms(prior)
