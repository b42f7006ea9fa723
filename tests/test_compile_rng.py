"""Random ops under torch.compile(backend="tpu") are captured: a compiled call with dropout,
rand, randn, bernoulli... is one program execution whose generator seed and offset are program
arguments, taken on every call from the default tpu generator (graph_runner.py,
csrc/include/torch_pjrt/capture.h). What that must preserve, against eager Strict mode run
from the same seed: the numbers each call draws, torch.manual_seed reproducing them, the
generator's position after a call (eager ops afterwards continue the same stream), and in
training the forward's dropout mask reused by the backward (losses and every gradient equal)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

from conftest import delta, grad_mismatches, metrics
from torch_pjrt import modes

TPU = torch.device("tpu")


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _draws(t):
    """Several random ops of different kinds and sizes, so each draws at its own offset."""
    a = F.dropout(t, 0.5, training=True)
    b = torch.rand_like(t)
    c = torch.randn(3, 5, device=t.device)
    d = torch.bernoulli(torch.full_like(t, 0.3))
    return a, b * 2 + 1, c, d


def _eager(fn, *args):
    with modes.eager_mode("strict"):
        return fn(*args)


def _cpu(outs):
    return [o.cpu() for o in outs]


def _assert_equal(got, want, what):
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), f"{what}: output {i} differs"


def test_random_graph_is_one_execution_per_call():
    cf = torch.compile(_draws, backend="tpu")
    t = torch.ones(16, 16, device=TPU)
    with torch.no_grad():
        cf(t)  # capture
        torch.tpu.synchronize()
        seen = []
        for _ in range(3):
            before = metrics()
            outs = cf(t)
            d = delta(before, metrics())
            assert d.get("executions") == 1 and d.get("graph_runs") == 1, d
            assert "defer_ops" not in d and "compiles" not in d, d
            seen.append(_cpu(outs))
    for i in range(len(seen[0])):
        assert not torch.equal(seen[0][i], seen[1][i]), f"two calls drew the same output {i}"
        assert not torch.equal(seen[1][i], seen[2][i]), f"two calls drew the same output {i}"


def test_manual_seed_reproduces_and_matches_eager():
    cf = torch.compile(_draws, backend="tpu")
    t = torch.ones(16, 16, device=TPU)
    with torch.no_grad():
        torch.manual_seed(7)
        compiled = [_cpu(cf(t)) for _ in range(3)]  # the capture's call, then two plan runs
        torch.manual_seed(7)
        again = [_cpu(cf(t)) for _ in range(3)]
        torch.manual_seed(7)
        eager = [_cpu(_eager(_draws, t)) for _ in range(3)]
    for k in range(3):
        _assert_equal(again[k], compiled[k], f"call {k} after the same manual_seed")
        _assert_equal(compiled[k], eager[k], f"call {k} against eager Strict")
    torch.manual_seed(8)
    with torch.no_grad():
        other = _cpu(cf(t))
    assert not torch.equal(other[1], compiled[0][1]), "another seed drew the same numbers"


def test_generator_stream_continues_after_a_compiled_call():
    cf = torch.compile(_draws, backend="tpu")
    t = torch.ones(8, 8, device=TPU)
    with torch.no_grad():
        cf(t)  # captured here; the calls below run the plan
        torch.manual_seed(3)
        cf(t)
        cf(t)
        state_compiled = torch.tpu.get_rng_state()
        after_compiled = _eager(lambda: torch.rand(100, device=TPU)).cpu()
        torch.manual_seed(3)
        _eager(_draws, t)
        _eager(_draws, t)
        state_eager = torch.tpu.get_rng_state()
        after_eager = _eager(lambda: torch.rand(100, device=TPU)).cpu()
    assert torch.equal(state_compiled, state_eager), \
        "a compiled call advanced the generator differently than eager"
    assert torch.equal(after_compiled, after_eager), \
        "eager draws after a compiled call do not continue the generator's stream"


def test_plan_takes_seed_and_offset_as_arguments():
    """The random ops' seed and offset are the program's only scalar arguments (one pair for
    the whole graph, whatever the number of random ops), not constants: one program and one
    plan serve every call."""
    from torch_pjrt.compile import graph_runner

    plans = []
    entry = graph_runner._entry

    def spy(plan, *layout):
        plans.append(plan)
        return entry(plan, *layout)

    graph_runner._entry = spy
    try:
        cf = torch.compile(_draws, backend="tpu")
        t = torch.ones(8, 8, device=TPU)
        with torch.no_grad():
            before = metrics()
            for _ in range(3):
                cf(t)
            d = delta(before, metrics())
    finally:
        graph_runner._entry = entry
    assert d.get("graph_captures") == 1 and d.get("graph_runs") == 3, d
    assert len(plans) == 1
    plan = plans[0]
    ndraws, device, increment = plan.draws()
    assert ndraws == 4 and device == 0, plan.draws()
    # each op's budget: its outputs' element count rounded up to 4, plus 4 (dispatch.cpp's
    # rng_increment); native_dropout has two outputs (the result and the mask)
    assert increment == (2 * 64 + 4) + (64 + 4) + (16 + 4) + (64 + 4), increment
    assert plan.stats()["scalars"] == 2, plan.stats()
    seed, offset = plan.scalars()
    assert isinstance(seed, int) and isinstance(offset, int)
    assert "tensor<i64>" in plan.text()


def _bernoulli_dropout(x, p):
    """Dropout written with bernoulli_ and rand_like, as some models do: the masks are fresh
    tensors filled in place, saved by AOTAutograd as forward outputs for the backward."""
    keep = torch.empty_like(x).bernoulli_(1 - p)
    jitter = (torch.rand_like(x) < 2.0).to(x.dtype)  # all ones, but a second draw
    return x * keep * jitter / (1 - p)


class DropMLP(torch.nn.Module):
    def __init__(self, kind="native"):
        super().__init__()
        self.kind = kind
        self.l1 = torch.nn.Linear(16, 32)
        self.l2 = torch.nn.Linear(32, 32)
        self.l3 = torch.nn.Linear(32, 4)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        if self.kind == "bernoulli":
            x = _bernoulli_dropout(F.relu(self.l1(x)), 0.5)
            return self.l3(_bernoulli_dropout(F.gelu(self.l2(x)), 0.25))
        x = self.drop(F.relu(self.l1(x)))
        x = F.dropout(F.gelu(self.l2(x)), 0.25, training=self.training)
        return self.l3(x)


@pytest.mark.parametrize("kind", ["native", "bernoulli"])
def test_dropout_mlp_training_matches_eager_strict(kind):
    torch.manual_seed(0)
    base = DropMLP(kind)
    batches = [(torch.randn(8, 16), torch.randint(0, 4, (8,))) for _ in range(4)]
    models, losses, grads = {}, {}, {}
    before = metrics()
    for mode in ("eager", "compiled"):
        model = copy.deepcopy(base).to(TPU)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step(x, y, model=model, opt=opt):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss

        run = torch.compile(step, backend="tpu") if mode == "compiled" else step
        torch.manual_seed(11)
        losses[mode], grads[mode] = [], []
        for x, y in batches:
            if mode == "eager":
                loss = _eager(run, x.to(TPU), y.to(TPU))
            else:
                loss = run(x.to(TPU), y.to(TPU))
            losses[mode].append(loss.item())
            grads[mode].append({n: p.grad.cpu().clone() for n, p in model.named_parameters()})
        models[mode] = model
    d = delta(before, metrics())
    # the compiled forward (with its random ops), backward and optimizer graphs were captured:
    # after the first step, every graph call ran its plan
    assert d.get("graph_captures", 0) >= 3 and d.get("graph_runs", 0) >= 3 * (len(batches) - 1), d
    assert losses["compiled"] == pytest.approx(losses["eager"], rel=1e-6, abs=1e-7), losses
    problems = []
    for i in range(len(batches)):
        want = copy.deepcopy(base)  # a CPU twin holding the eager step's gradients
        got = copy.deepcopy(base)
        for n, p in want.named_parameters():
            p.grad = grads["eager"][i][n]
        for n, p in got.named_parameters():
            p.grad = grads["compiled"][i][n]
        problems += [f"step {i}: {m}" for m in grad_mismatches(want, got, rtol=1e-5, atol=1e-6)]
    assert not problems, "\n".join(problems[:10])
    for (n, a), (_, b) in zip(models["eager"].named_parameters(),
                              models["compiled"].named_parameters()):
        torch.testing.assert_close(b.detach().cpu(), a.detach().cpu(), rtol=1e-5, atol=1e-6,
                                   msg=n)
    # dropout was active: with the masks of another seed the losses change
    assert len(set(round(v, 6) for v in losses["eager"])) == len(batches)


def test_dropout_mlp_step_is_captured():
    """The forward graph (with dropout) and the backward graph are each one execution."""
    torch.manual_seed(0)
    model = DropMLP().to(TPU)
    cm = torch.compile(model, backend="tpu")
    x = torch.randn(8, 16, device=TPU)
    for _ in range(2):
        cm(x).sum().backward()
    torch.tpu.synchronize()
    before = metrics()
    out = cm(x)
    d = delta(before, metrics())
    assert d.get("graph_runs") == 1 and d.get("executions") == 1, d
    assert "defer_ops" not in d, d
    out.sum().backward()
