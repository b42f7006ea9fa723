"""Strict mode compiles new programs in the background (csrc/graph/compile_async.c): an op at a
new shape returns before its program is compiled, later ops queue behind it, and everything
runs in program order at the next synchronizing point. Values, errors and counters must be
what synchronous compiles give."""
import gc

import pytest
import torch

import torch_pjrt

TPU = torch.device("tpu")
_C = torch_pjrt._C


@pytest.fixture
def background(request):
    """Background compiles with two threads, in Strict mode; the old settings after."""
    old = _C._compile_threads()
    _C._set_compile_threads(2)
    with torch.tpu.eager_mode("strict"):
        yield
    _C._set_compile_threads(old)


def _program(x, y, n):
    """A chain of elementwise ops, a reduction, an in-place update and a view write: new
    programs at every n."""
    a = x.exp() * y + 1.5
    b = torch.where(a > 2, a, -a).sum(dim=0)
    y.mul_(2)
    y[: n // 2].add_(a[: n // 2])
    return a, b, y


@pytest.mark.parametrize("threads", [0, 2])
def test_values_equal_cpu_with_and_without_background_compiles(threads):
    old = _C._compile_threads()
    _C._set_compile_threads(threads)
    try:
        with torch.tpu.eager_mode("strict"):
            for n in (3, 5, 11):
                g = torch.Generator().manual_seed(n)
                x, y = torch.randn(n, 4, generator=g), torch.randn(n, 4, generator=g)
                want = _program(x.clone(), y.clone(), n)
                got = _program(x.to(TPU), y.to(TPU), n)
                for w, t in zip(want, got):
                    assert t.dtype == w.dtype and t.shape == w.shape
                    torch.testing.assert_close(t.cpu(), w)
    finally:
        _C._set_compile_threads(old)


def test_a_new_program_is_queued_and_runs_at_the_read(background):
    x = torch.arange(13, dtype=torch.float32).to(TPU)
    torch.tpu.synchronize()
    before = torch.tpu.metrics()
    y = x * 3 + 0.25  # two new programs (13 elements of float32 is a size no test compiles)
    assert _C._defer_pending_ops() == 2  # queued behind their compiles
    z = y - 1  # a third one queues behind them
    assert _C._defer_pending_ops() == 3
    torch.testing.assert_close(z.cpu(), torch.arange(13, dtype=torch.float32) * 3 - 0.75)
    assert _C._defer_pending_ops() == 0
    after = torch.tpu.metrics()
    assert after["compiles"] - before["compiles"] == 3
    # the same ops again: cached, run at once
    y2 = x * 3 + 0.25
    assert _C._defer_pending_ops() == 0
    torch.testing.assert_close(y2.cpu(), y.cpu())


def test_cache_hits_behind_a_queued_op_keep_program_order(background):
    x = torch.ones(17).to(TPU)
    x.add_(1)  # warm program for add_ at this shape
    torch.tpu.synchronize()
    y = x.sin()  # new: queued, reads x before the next update
    x.add_(1)  # cached, but must not run before sin read x
    torch.testing.assert_close(y.cpu(), torch.full((17,), 2.0).sin())
    torch.testing.assert_close(x.cpu(), torch.full((17,), 3.0))


def test_lowering_errors_are_raised_at_the_op(background):
    a = torch.arange(6).to(TPU)
    pending = a.float().cos()  # queued
    assert _C._defer_pending_ops() > 0
    with pytest.raises(NotImplementedError, match="hypot"):
        torch.hypot(a, a)  # CPU has no integer kernel: raised now, not at the read
    torch.testing.assert_close(pending.cpu(), torch.arange(6).float().cos())


def test_memory_and_counters_see_queued_ops_as_run(background):
    gc.collect()  # tensors of earlier tests in reference cycles: freed now, not mid-test
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    x = torch.randn(19, 3).to(TPU)
    y = x.tanh() + 2  # queued; holds x's storage until it runs
    del x
    # memory statistics run what is queued first: only y remains
    assert torch.tpu.memory_allocated() - base == y.numel() * 4
    del y
    assert torch.tpu.memory_allocated() == base


def test_debug_mode_compiles_in_the_op(background):
    with torch.tpu.eager_mode("debug"):
        x = torch.ones(23).to(TPU)
        y = x.atan()
        assert _C._defer_pending_ops() == 0
        torch.testing.assert_close(y.cpu(), torch.ones(23).atan())


def test_thread_count_setting():
    old = _C._compile_threads()
    try:
        _C._set_compile_threads(0)
        assert _C._compile_threads() == 0
        with torch.tpu.eager_mode("strict"):
            y = torch.ones(29).to(TPU).expm1()
            assert _C._defer_pending_ops() == 0  # compiled in the op
            torch.testing.assert_close(y.cpu(), torch.ones(29).expm1())
        _C._set_compile_threads(3)
        assert _C._compile_threads() == 3
    finally:
        _C._set_compile_threads(old)
