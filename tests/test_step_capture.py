"""Whole-step capture (torch_pjrt/serving/vllm/step_capture.py) without vLLM: a StepRunner over
a function that calls compiled graphs, reads tensors it is not given (refilled between calls,
as the serving metadata buffers are) and writes a tensor in place (as the KV cache is). Each
later call must be one program execution that reads and writes those storages as they are at
that call, with CPU's results."""
from __future__ import annotations

import torch
import torch._dynamo

from conftest import delta, metrics
from torch_pjrt.serving.vllm.step_capture import StepRunner

TPU = torch.device("tpu")


def _step(inner):
    """(function of x, the external tensors it reads and writes) on `device`."""

    def make(device):
        table = torch.zeros(4, device=device)  # read: refilled by whole copies between calls
        cache = torch.zeros(3, 4, device=device)  # written in place, one row per call

        def fn(x, row):
            y = inner(x) + table
            cache.index_copy_(0, row, y.view(1, 4))  # the row comes in as a tensor input
            return y.sum(0, keepdim=True)

        return fn, table, cache

    return make


def test_step_is_one_execution_reading_and_writing_kept_storages(fresh_dynamo):
    inner_tpu = torch.compile(lambda x: torch.tanh(x) * 2, backend="tpu")
    fn, table, cache = _step(inner_tpu)(TPU)
    ref_fn, ref_table, ref_cache = _step(lambda x: torch.tanh(x) * 2)("cpu")
    runner = StepRunner(lambda x, row: (fn(x, row),), "step")
    x = torch.linspace(-1, 1, 4)
    before = None
    for call in range(3):
        fill = torch.full((4,), float(call + 1))
        table.copy_(fill)  # a whole-buffer copy: the same storage, a new buffer
        ref_table.copy_(fill)
        row = torch.tensor([call])
        if call == 2:
            before = metrics()
        got = runner(x.to(TPU), row.to(TPU))[0]
        want = ref_fn(x, row)
        torch.testing.assert_close(got.cpu(), want)
        torch.testing.assert_close(cache.cpu(), ref_cache)
    assert len(runner.plans) == 1
    d = delta(before, metrics())
    assert d["graph_runs"] == 1 and d["executions"] == 1, d  # the inner graph recorded into it


def test_a_step_whose_capture_breaks_still_runs(fresh_dynamo):
    # a host read inside breaks the capture: the step runs as it would without it, every call
    def fn(x):
        scale = float(x.abs().max().item())
        return (x / scale,)

    runner = StepRunner(fn, "broken")
    for _ in range(2):
        x = torch.randn(5)
        torch.testing.assert_close(runner(x.to(TPU))[0].cpu(), x / x.abs().max())
    assert len(runner.plans) == 0 and len(runner.uncapturable) == 1
