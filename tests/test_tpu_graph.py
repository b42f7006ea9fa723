"""torch.tpu.TPUGraph / torch.tpu.graph (torch_pjrt/graphs.py): a whole training step recorded
as one program, replayed with CUDA graphs' semantics, against the same steps on CPU."""
import copy

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt  # noqa: F401
from conftest import metrics

TPU = torch.device("tpu")


def _step(opt, model, x, y):
    opt.zero_grad(set_to_none=False)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def _setup():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    tpu = copy.deepcopy(cpu).to(TPU)
    copt = torch.optim.AdamW(cpu.parameters(), lr=0.05)
    topt = torch.optim.AdamW(tpu.parameters(), lr=0.05, capturable=True)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)) for _ in range(7)]
    for x, y in data[:2]:  # warm-up: AdamW's state exists before the capture
        _step(copt, cpu, x, y)
        _step(topt, tpu, x.to(TPU), y.to(TPU))
    return cpu, tpu, copt, topt, data[2:]


def test_training_step_replays_as_one_program_with_cpu_values():
    cpu, tpu, copt, topt, data = _setup()
    sx, sy = data[0][0].to(TPU), data[0][1].to(TPU)
    before = [p.detach().cpu().clone() for p in tpu.parameters()]
    g = torch.tpu.TPUGraph()
    m0 = metrics()
    with torch.tpu.graph(g):
        sloss = _step(topt, tpu, sx, sy)
    m1 = metrics()
    # the capture runs nothing: parameters as before, the loss created inside reads zeros
    assert m1["executions"] == m0["executions"]
    for p, b in zip(tpu.parameters(), before):
        assert torch.equal(p.detach().cpu(), b)
    assert sloss.cpu().item() == 0.0
    for i, (x, y) in enumerate(data):
        want = _step(copt, cpu, x, y)
        sx.copy_(x)
        sy.copy_(y)
        m0 = metrics()
        g.replay()
        m1 = metrics()
        if i > 0:  # the first replay may trim inputs eager ops left padded (size buckets)
            assert m1["executions"] - m0["executions"] == 1
        torch.testing.assert_close(sloss.cpu(), want, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(tpu.named_parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5, msg=name)
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-5, msg=name)
        torch.testing.assert_close(topt.state[p]["exp_avg_sq"].cpu(),
                                   copt.state[q]["exp_avg_sq"], rtol=1e-4, atol=1e-7, msg=name)
    assert torch.tpu.get_eager_mode() == "strict"  # the capture's mode switch is undone


def test_random_ops_draw_anew_on_every_replay():
    x = torch.ones(64, device=TPU)
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        out = F.dropout(x, 0.5, training=True)
    torch.manual_seed(3)
    g.replay()
    first = out.cpu().clone()
    g.replay()
    second = out.cpu().clone()
    assert not torch.equal(first, second)
    assert set(first.unique().tolist()) <= {0.0, 2.0}
    torch.manual_seed(3)
    g.replay()
    assert torch.equal(out.cpu(), first)  # the generator decides, as for eager draws


def test_a_host_read_inside_the_capture_raises_and_the_work_has_run():
    w = torch.zeros(4, device=TPU)
    g = torch.tpu.TPUGraph()
    with pytest.raises(RuntimeError, match="could not be recorded"):
        with torch.tpu.graph(g):
            w.add_(1)
            w.sum().item()
            w.add_(1)
    assert w.cpu().tolist() == [2.0] * 4
    with pytest.raises(RuntimeError, match="before a capture"):
        g.replay()
    assert torch.tpu.get_eager_mode() == "strict"


def test_an_exception_inside_the_block_propagates_and_leaves_no_capture():
    w = torch.zeros(3, device=TPU)
    g = torch.tpu.TPUGraph()
    with pytest.raises(ValueError, match="boom"):
        with torch.tpu.graph(g):
            w.add_(1)
            raise ValueError("boom")
    assert not torch_pjrt.device._C._capture_active()
    assert w.cpu().tolist() == [1.0] * 3  # what was recorded ran
    with torch.tpu.graph(g):  # and the graph can capture afterwards
        w.mul_(3)
    g.replay()
    assert w.cpu().tolist() == [3.0] * 3
    with pytest.raises(RuntimeError, match="reset"):
        g.capture_begin()
    g.reset()
    with pytest.raises(RuntimeError, match="before a capture"):
        g.replay()


def test_a_capture_without_tpu_work_warns_and_replays_nothing():
    g = torch.tpu.TPUGraph()
    x = torch.ones(3)
    with pytest.warns(UserWarning, match="no tpu work"):
        with torch.tpu.graph(g):
            x.add_(1)  # CPU work: runs now, is not recorded
    assert x.tolist() == [2.0] * 3
    g.replay()
    assert x.tolist() == [2.0] * 3
