"""torch.tpu.step_profile(): per compiled step, device time per program, host time in the
backend, in Dynamo's/AOTAutograd's wrappers and the rest (torch_pjrt/compile/attribution.py)."""
import pytest
import torch

import torch_pjrt  # noqa: F401
from torch_pjrt.compile import attribution


def _training_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(),
                                torch.nn.Linear(32, 4)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(model, backend="tpu")
    x = torch.randn(8, 32, device="tpu")

    def step():
        loss = compiled(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


def test_compiled_step_attribution_names_each_graph_and_adds_up():
    step = _training_step()
    for _ in range(2):
        step()
    with torch.tpu.step_profile() as prof:
        for _ in range(3):
            with prof.step():
                step()
    assert len(prof.steps) == 3 and prof.dropped == 0
    for s in prof.steps:
        # the forward and backward graphs each ran once, as one program each
        fwd = [k for k in s.programs if k.endswith("_forward")]
        bwd = [k for k in s.programs if k.endswith("_backward")]
        assert len(fwd) == 1 and len(bwd) == 1, s.programs
        assert len(s.programs[fwd[0]]) == 1 and len(s.programs[bwd[0]]) == 1
        # the eager loss, its backward and the optimizer's ops ran too, each program named
        # after its op
        eager = {k for k in s.programs if k.startswith("eager:")}
        assert {"eager:pow", "eager:mean", "eager:_foreach_add"} <= eager, s.programs
        assert s.device_ms == pytest.approx(sum(sum(v) for v in s.programs.values()))
        assert s.device_ms > 0 and s.backend_host_ms > 0 and s.wrapper_host_ms > 0
        # the host columns partition the step's wall time
        parts = s.backend_host_ms + s.wrapper_host_ms + s.other_host_ms + s.waiting_ms
        assert parts == pytest.approx(s.wall_ms, rel=1e-6, abs=1e-3)
    summary = prof.summary(skip=1)
    assert summary["steps"] == 2
    assert summary["programs"]["eager:mean"]["runs_per_step"] == 1
    table = prof.table()
    assert "| program |" in table and "_backward" in table


def test_profile_is_off_outside_its_block_and_nests_never():
    step = _training_step()
    step()
    with torch.tpu.step_profile() as prof:
        with pytest.raises(RuntimeError, match="already recording"):
            torch.tpu.step_profile().__enter__()
        with prof.step():
            step()
    assert attribution.active is None
    with pytest.raises(RuntimeError, match="outside"):
        with prof.step():
            pass
    # nothing is recorded once the block is left
    step()
    torch.tpu.synchronize()
    from torch_pjrt.device import _C
    records, _ = _C._exec_profile_take()
    assert records == []


def test_device_times_follow_issue_order_per_device():
    ms = 1_000_000
    records = [
        (0, "a", 0, 2 * ms),            # alone: 2 ms
        (0, "b", 1 * ms, 5 * ms),       # queued behind a: from a's end, 3 ms
        (0, "a", 7 * ms, 8 * ms),       # after an idle gap: 1 ms
        (1, "c", 0, 4 * ms),            # another device: its own queue
    ]
    got = attribution.device_times(records)
    assert got == {"a": [2.0, 1.0], "b": [3.0], "c": [4.0]}


def test_host_time_goes_to_the_innermost_range():
    spans = [(0, 1000, "wrapper"),      # a compiled region on the host thread
             (200, 400, "backend"),     # the forward graph's runner inside it
             (500, 900, "other"),       # the autograd engine's task on its own thread
             (600, 800, "wrapper"),     # AOTAutograd's backward function in that task
             (650, 700, "backend")]     # the backward graph's runner
    got = attribution.classify_ms(spans)
    assert got == pytest.approx({"wrapper": 0.55, "backend": 0.25, "other": 0.2})
    # a child with its parent's very times (one clock tick) is the inner one by its depth
    tie = [(0, 100, "wrapper", 1), (0, 100, "backend", 2)]
    assert attribution.classify_ms(tie) == pytest.approx(
        {"wrapper": 0.0, "backend": 0.1, "other": 0.0})
