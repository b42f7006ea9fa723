"""Recurrent layers on tpu against CPU: nn.LSTM, nn.GRU, nn.RNN (tanh and relu) and the three
cells, forward outputs and states, and training (SGD steps, every parameter's gradient compared
at every step, initial states included where they are learned), with no CPU fallback.

On a non-CPU device PyTorch's RNN code computes the gate matmuls itself and hands the pointwise
part of each time step to the fused cell ops (aten::_thnn_fused_lstm_cell, _thnn_fused_gru_cell
and their backwards; csrc/ops/rnn.c), whose saved workspace the backward reads; CPU runs the
unfused composite math, which is the reference here. nn.RNN has no fused cell (plain ops).
The ops themselves are also checked directly: outputs, the workspace layout and the backwards
with either LSTM state gradient missing (autograd passes None for an unused state).
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from conftest import grad_mismatches, metrics

TPU = torch.device("tpu")
T, B, IN, HID = 5, 3, 6, 4

KINDS = {
    "lstm": (nn.LSTM, {}),
    "gru": (nn.GRU, {}),
    "rnn_tanh": (nn.RNN, {"nonlinearity": "tanh"}),
    "rnn_relu": (nn.RNN, {"nonlinearity": "relu"}),
}

CONFIGS = {
    "one_layer": {},
    "two_layers_bidirectional": {"num_layers": 2, "bidirectional": True},
    "two_layers_bidirectional_batch_first": {"num_layers": 2, "bidirectional": True,
                                             "batch_first": True},
    "two_layers_no_bias": {"num_layers": 2, "bias": False},
    "bidirectional_no_bias_batch_first": {"bidirectional": True, "bias": False,
                                          "batch_first": True},
}


def _close(tpu_value, cpu_value, rtol=1e-4, atol=1e-5, what=""):
    assert tpu_value.device.type == "tpu", what
    torch.testing.assert_close(tpu_value.cpu(), cpu_value, rtol=rtol, atol=atol,
                               msg=lambda m: f"{what}: {m}")


class _Readout(nn.Module):
    """An RNN and fixed random read-out weights turning each of its results into a scalar loss
    term (a plain .sum() would give every element the same gradient). `use` picks which results
    enter the loss: unused LSTM states reach the fused backward as None gradients."""

    def __init__(self, rnn: nn.Module, use=("out", "h", "c")):
        super().__init__()
        self.rnn, self.use = rnn, use
        self.h0 = self.c0 = None

    def learn_initial_state(self, h0, c0=None):
        self.h0 = nn.Parameter(h0)
        self.c0 = nn.Parameter(c0) if c0 is not None else None
        return self

    def forward(self, x):
        if self.h0 is None:
            out, state = self.rnn(x)
        else:
            out, state = self.rnn(x, (self.h0, self.c0) if self.c0 is not None else self.h0)
        h, c = state if isinstance(state, tuple) else (state, None)
        return out, h, c

    def loss(self, results):
        names = ("out", "h", "c")
        total = 0
        for i, r in enumerate(results):
            if r is None or names[i] not in self.use:
                continue
            if isinstance(r, torch.nn.utils.rnn.PackedSequence):
                r = pad_packed_sequence(r)[0]
            g = torch.Generator().manual_seed(100 + i)
            w = torch.randn(r.shape, generator=g).to(r.device)
            total = total + (r * w).sum() + 0.1 * (r * r).sum()
        return total


def _train(cpu_model: _Readout, make_inputs, fallbacks, steps=3, lr=0.05, forward_rtol=1e-4):
    """Trains a CPU model and its tpu copy in lockstep with SGD: at every step the results (out,
    h, c), the loss and every parameter's gradient must match."""
    tpu_model = copy.deepcopy(cpu_model).to(TPU)
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=lr)
    tpu_opt = torch.optim.SGD(tpu_model.parameters(), lr=lr)
    fallbacks.reset()
    problems = []
    for step in range(steps):
        x = make_inputs(step)
        losses = []
        results = []
        for model, opt, dev in ((cpu_model, cpu_opt, "cpu"), (tpu_model, tpu_opt, TPU)):
            opt.zero_grad()
            r = model(x(dev) if callable(x) else x.to(dev))
            loss = model.loss(r)
            loss.backward()
            losses.append(loss)
            results.append(r)
        rtol, atol = (1e-4, 1e-5) if step == 0 else (1e-3, 1e-4)
        for name, c, t in zip(("out", "h_n", "c_n"), results[0], results[1]):
            if c is None:
                assert t is None, name
                continue
            if isinstance(c, torch.nn.utils.rnn.PackedSequence):
                c, t = pad_packed_sequence(c)[0], pad_packed_sequence(t)[0]
            _close(t, c.detach(), rtol=max(rtol, forward_rtol), atol=atol,
                   what=f"step {step} {name}")
        _close(losses[1].detach(), losses[0].detach(), rtol=rtol, atol=atol,
               what=f"step {step} loss")
        problems += [f"step {step}: {p}"
                     for p in grad_mismatches(cpu_model, tpu_model, rtol=rtol, atol=atol)]
        cpu_opt.step()
        tpu_opt.step()
    assert not problems, "\n".join(problems[:8])
    fallbacks.assert_none("tpu training")
    return tpu_model


def _make(kind, seed=0, **kw):
    cls, base = KINDS[kind]
    torch.manual_seed(seed)
    return cls(IN, HID, **base, **kw)


def _seq_inputs(batch_first, seed=1):
    def make(step):
        g = torch.Generator().manual_seed(seed * 1000 + step)
        shape = (B, T, IN) if batch_first else (T, B, IN)
        return torch.randn(shape, generator=g)
    return make


# ---- the layers ----


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("kind", list(KINDS))
def test_layer_trains_like_cpu(kind, config, fallbacks):
    kw = CONFIGS[config]
    model = _Readout(_make(kind, **kw))
    _train(model, _seq_inputs(kw.get("batch_first", False)), fallbacks)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("kind", list(KINDS))
def test_learned_initial_states(kind, batch_first, fallbacks):
    # h0 (and c0) are parameters: their gradients are compared too, and SGD moves them
    rnn = _make(kind, seed=2, num_layers=2, bidirectional=True, batch_first=batch_first)
    g = torch.Generator().manual_seed(3)
    h0 = torch.randn(4, B, HID, generator=g)  # (layers * directions, batch, hidden) either way
    c0 = torch.randn(4, B, HID, generator=g) if kind == "lstm" else None
    model = _Readout(rnn).learn_initial_state(h0, c0)
    _train(model, _seq_inputs(batch_first, seed=2), fallbacks)


@pytest.mark.parametrize("use", [("out",), ("h",), ("c",), ("out", "c")])
def test_lstm_unused_states_give_none_gradients(use, fallbacks):
    # an unused h_n / c_n / output reaches the fused LSTM backward as a None gradient
    model = _Readout(_make("lstm", seed=4, num_layers=2), use=use)
    _train(model, _seq_inputs(False, seed=4), fallbacks, steps=2)


def test_lstm_with_projections(fallbacks):
    model = _Readout(_make("lstm", seed=5, num_layers=2, bidirectional=True, proj_size=3))
    _train(model, _seq_inputs(False, seed=5), fallbacks)


@pytest.mark.parametrize("kind", list(KINDS))
def test_unbatched_input(kind, fallbacks):
    model = _Readout(_make(kind, seed=6, num_layers=2))

    def make(step):
        return torch.randn(T, IN, generator=torch.Generator().manual_seed(60 + step))

    _train(model, make, fallbacks, steps=2)


@pytest.mark.parametrize("enforce_sorted", [True, False])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("kind", list(KINDS))
def test_packed_sequences(kind, batch_first, enforce_sorted, fallbacks):
    lengths = torch.tensor([5, 4, 2] if enforce_sorted else [2, 5, 4])
    model = _Readout(_make(kind, seed=7, num_layers=2, bidirectional=True,
                           batch_first=batch_first))
    seqs = _seq_inputs(batch_first, seed=7)

    def make(step):
        x = seqs(step)
        return lambda dev: pack_padded_sequence(x.to(dev), lengths, batch_first=batch_first,
                                                enforce_sorted=enforce_sorted)

    _train(model, make, fallbacks)


# ---- the cells ----

CELLS = {
    "lstm_cell": (nn.LSTMCell, {}),
    "gru_cell": (nn.GRUCell, {}),
    "rnn_cell_tanh": (nn.RNNCell, {"nonlinearity": "tanh"}),
    "rnn_cell_relu": (nn.RNNCell, {"nonlinearity": "relu"}),
}


class _Unrolled(nn.Module):
    """A cell applied over T steps, its state carried (the first step from `h0`, or None)."""

    def __init__(self, cell, learn_h0, batched=True):
        super().__init__()
        self.cell, self.batched = cell, batched
        lstm = isinstance(cell, nn.LSTMCell)
        shape = (B, HID) if batched else (HID,)
        g = torch.Generator().manual_seed(8)
        self.h0 = nn.Parameter(torch.randn(shape, generator=g)) if learn_h0 else None
        self.c0 = nn.Parameter(torch.randn(shape, generator=g)) if learn_h0 and lstm else None

    def forward(self, x):
        state = None
        if self.h0 is not None:
            state = (self.h0, self.c0) if self.c0 is not None else self.h0
        outs = []
        for t in range(x.shape[0]):
            state = self.cell(x[t], state)
            outs.append(state[0] if isinstance(state, tuple) else state)
        c = state[1] if isinstance(state, tuple) else None
        return torch.stack(outs), outs[-1], c

    loss = _Readout.loss
    use = ("out", "h", "c")


@pytest.mark.parametrize("learn_h0", [False, True], ids=["no_state", "initial_state"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("cell", list(CELLS))
def test_cell_trains_like_cpu(cell, bias, learn_h0, fallbacks):
    cls, kw = CELLS[cell]
    torch.manual_seed(9)
    model = _Unrolled(cls(IN, HID, bias=bias, **kw), learn_h0)
    _train(model, _seq_inputs(False, seed=9), fallbacks)


@pytest.mark.parametrize("cell", list(CELLS))
def test_cell_unbatched(cell, fallbacks):
    cls, kw = CELLS[cell]
    torch.manual_seed(10)
    model = _Unrolled(cls(IN, HID, **kw), learn_h0=True, batched=False)

    def make(step):
        return torch.randn(T, IN, generator=torch.Generator().manual_seed(100 + step))

    _train(model, make, fallbacks, steps=2)


def test_double_backward_through_lstm_and_gru_cells(fallbacks):
    # with create_graph the cells' backward is PyTorch's differentiable composite (plain ops)
    results = {}
    for dev in ("cpu", TPU):
        torch.manual_seed(11)
        cells = [nn.LSTMCell(IN, HID).to(dev), nn.GRUCell(IN, HID).to(dev)]
        x = torch.randn(B, IN, generator=torch.Generator().manual_seed(12)).to(dev)
        x.requires_grad_(True)
        h, c = cells[0](x)
        y = cells[1](x, h)
        (gx,) = torch.autograd.grad((y * y).sum() + (c * c).sum(), x, create_graph=True)
        (gx * gx).sum().backward()
        results[str(dev)] = [gx.detach(), x.grad] + [p.grad for m in cells for p in m.parameters()]
    for i, (c, t) in enumerate(zip(results["cpu"], results["tpu"])):
        _close(t, c, what=f"result {i}")
    fallbacks.assert_none()


# ---- the fused ops themselves ----


def _lstm_reference(ig, hg, cx, bi, bh):
    gates = (ig + bi if bi is not None else ig) + (hg + bh if bh is not None else hg)
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    return o * cy.tanh(), cy, torch.cat([i, f, g, o], 1)


def _gru_reference(ig, hg, hx, bi, bh):
    ig = ig + bi if bi is not None else ig
    hg = hg + bh if bh is not None else hg
    ir, iz, in_ = ig.chunk(3, 1)
    hr, hz, hn = hg.chunk(3, 1)
    r, z = (ir + hr).sigmoid(), (iz + hz).sigmoid()
    n = (in_ + r * hn).tanh()
    return n + z * (hx - n), torch.cat([r, z, n, hx, hn], 1)


def _rand(*shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("bias", [True, False])
def test_fused_lstm_cell_op_and_workspace(bias, fallbacks):
    ig, hg, cx = _rand(B, 4 * HID, seed=1), _rand(B, 4 * HID, seed=2), _rand(B, HID, seed=3)
    bi = _rand(4 * HID, seed=4) if bias else None
    bh = _rand(4 * HID, seed=5) if bias else None
    ref = _lstm_reference(ig, hg, cx, bi, bh)
    tpu = [t.to(TPU) if t is not None else None for t in (ig, hg, cx, bi, bh)]
    got = torch.ops.aten._thnn_fused_lstm_cell(*tpu)
    for name, t, c in zip(("hy", "cy", "workspace"), got, ref):
        _close(t, c, what=name)
    hy, cy, ws = got
    # the backward against autograd of the reference, with either state gradient missing
    gh, gc = _rand(B, HID, seed=6), _rand(B, HID, seed=7)
    for grad_hy, grad_cy in ((gh, gc), (gh, None), (None, gc)):
        leaves = [t.clone().requires_grad_() for t in (ig, hg, cx)]
        rhy, rcy, _ = _lstm_reference(*leaves, bi, bh)
        outs = [o for o, g in ((rhy, grad_hy), (rcy, grad_cy)) if g is not None]
        grads = [g for g in (grad_hy, grad_cy) if g is not None]
        d_ig, d_hg, d_cx = torch.autograd.grad(outs, leaves, grads)
        dgates, dcx, dbias = torch.ops.aten._thnn_fused_lstm_cell_backward_impl(
            *[g.to(TPU) if g is not None else None for g in (grad_hy, grad_cy)],
            cx.to(TPU), cy, ws, bias)
        what = f"grad_hy {'set' if grad_hy is not None else 'None'}, " \
               f"grad_cy {'set' if grad_cy is not None else 'None'}"
        _close(dgates, d_ig, what=what + ": grad_gates")
        torch.testing.assert_close(d_ig, d_hg)  # one gate gradient serves both gate inputs
        _close(dcx, d_cx, what=what + ": grad_cx")
        if bias:
            _close(dbias, d_ig.sum(0), what=what + ": grad_bias")
        else:
            assert dbias is None
    fallbacks.assert_none()


@pytest.mark.parametrize("bias", [True, False])
def test_fused_gru_cell_op_and_workspace(bias, fallbacks):
    ig, hg, hx = _rand(B, 3 * HID, seed=11), _rand(B, 3 * HID, seed=12), _rand(B, HID, seed=13)
    bi = _rand(3 * HID, seed=14) if bias else None
    bh = _rand(3 * HID, seed=15) if bias else None
    ref = _gru_reference(ig, hg, hx, bi, bh)
    tpu = [t.to(TPU) if t is not None else None for t in (ig, hg, hx, bi, bh)]
    hy, ws = torch.ops.aten._thnn_fused_gru_cell(*tpu)
    _close(hy, ref[0], what="hy")
    _close(ws, ref[1], what="workspace")
    gy = _rand(B, HID, seed=16)
    leaves = [t.clone().requires_grad_() for t in (ig, hg, hx)]
    d_ig, d_hg, d_hx = torch.autograd.grad(_gru_reference(*leaves, bi, bh)[0], leaves, gy)
    got = torch.ops.aten._thnn_fused_gru_cell_backward(gy.to(TPU), ws, bias)
    _close(got[0], d_ig, what="grad_input_gates")
    _close(got[1], d_hg, what="grad_hidden_gates")
    _close(got[2], d_hx, what="grad_hx")
    if bias:
        _close(got[3], d_ig.sum(0), what="grad_input_bias")
        _close(got[4], d_hg.sum(0), what="grad_hidden_bias")
    else:
        assert got[3] is None and got[4] is None
    fallbacks.assert_none()


@pytest.mark.parametrize("presized", [True, False], ids=["sized", "empty"])
def test_fused_cells_out_variants(presized, fallbacks):
    ig4, hg4, st = _rand(B, 4 * HID, seed=21), _rand(B, 4 * HID, seed=22), _rand(B, HID, seed=23)
    ig3, hg3 = _rand(B, 3 * HID, seed=24), _rand(B, 3 * HID, seed=25)
    cases = (
        (torch.ops.aten._thnn_fused_lstm_cell.out, (ig4, hg4, st),
         _lstm_reference(ig4, hg4, st, None, None)),
        (torch.ops.aten._thnn_fused_gru_cell.out, (ig3, hg3, st),
         _gru_reference(ig3, hg3, st, None, None)),
    )
    for op, args, ref in cases:
        outs = {f"out{k}": torch.empty(r.shape if presized else (0,), device=TPU)
                for k, r in enumerate(ref)}
        got = op(*[a.to(TPU) for a in args], **outs)
        for k, (g, r) in enumerate(zip(got, ref)):
            assert g is outs[f"out{k}"]
            _close(g, r, what=f"{op} out{k}")
    fallbacks.assert_none()


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_float64_training(kind, fallbacks):
    model = _Readout(_make(kind, seed=16, num_layers=2, bidirectional=True).double())

    def make(step):
        return _rand(T, B, IN, seed=160 + step).double()

    _train(model, make, fallbacks, steps=2)


def test_fused_cell_shape_errors_are_runtime_errors():
    # the Meta kernels check the ops' contracts (the CUDA kernels' checks) before any lowering
    ig = torch.randn(B, 4 * HID, device=TPU)
    with pytest.raises(RuntimeError, match="hidden_gates"):
        torch.ops.aten._thnn_fused_lstm_cell(ig, ig[:, :-1], torch.randn(B, HID, device=TPU))
    with pytest.raises(RuntimeError, match="state"):
        torch.ops.aten._thnn_fused_lstm_cell(ig, ig, torch.randn(B, HID + 1, device=TPU))
    g3 = torch.randn(B, 3 * HID, device=TPU)
    with pytest.raises(RuntimeError, match="biases"):
        torch.ops.aten._thnn_fused_gru_cell(g3, g3, torch.randn(B, HID, device=TPU),
                                            torch.randn(HID, device=TPU),
                                            torch.randn(HID, device=TPU))
    with pytest.raises(RuntimeError, match="workspace"):
        torch.ops.aten._thnn_fused_gru_cell_backward(torch.randn(B, HID, device=TPU),
                                                     torch.randn(B, 4 * HID, device=TPU), True)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_bad_input_raises_like_cpu(kind):
    rnn = _make(kind)
    tpu = copy.deepcopy(rnn).to(TPU)
    for x in (torch.randn(T, B, IN + 1), torch.randn(T, B, IN, 2)):
        with pytest.raises(Exception) as cpu_err:
            rnn(x)
        with pytest.raises(type(cpu_err.value)) as tpu_err:
            tpu(x.to(TPU))
        assert str(tpu_err.value) == str(cpu_err.value)


# ---- modes, bfloat16, torch.compile ----


@pytest.mark.long
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_training_in_every_eager_mode(kind, mode, fallbacks):
    model = _Readout(_make(kind, seed=13, num_layers=2, bidirectional=True))
    _train(model, _seq_inputs(False, seed=13), fallbacks, steps=2)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_bfloat16_forward(kind, fallbacks):
    # against CPU float32 on the same bfloat16-rounded weights and inputs (CPU's own bfloat16
    # path rounds after every unfused op; the fused cells round once per result)
    rnn = _make(kind, seed=14, num_layers=2, bidirectional=True).to(torch.bfloat16)
    x = _rand(T, B, IN, seed=14).to(torch.bfloat16)
    ref_out, ref_state = copy.deepcopy(rnn).float()(x.float())
    tpu = copy.deepcopy(rnn).to(TPU)
    fallbacks.reset()
    out, state = tpu(x.to(TPU))
    assert out.dtype == torch.bfloat16
    _close(out.float(), ref_out, rtol=2e-2, atol=2e-2, what="out")
    ref_state = ref_state if isinstance(ref_state, tuple) else (ref_state,)
    state = state if isinstance(state, tuple) else (state,)
    for t, c in zip(state, ref_state):
        _close(t.float(), c, rtol=2e-2, atol=2e-2, what="state")
    fallbacks.assert_none()


# Dynamo refuses nn.RNN/LSTM/GRU modules by default (a graph break: "Dynamo does not support
# RNN, GRU, or LSTM", the layer then runs eagerly, through the fused cells); with
# torch._dynamo.config.allow_rnn it traces them, and AOTAutograd decomposes aten::lstm / gru /
# rnn_* into matmuls and pointwise ops (PyTorch's decompositions): the compiled graph holds no
# fused cell. Both ways must train like CPU without a fallback.
@pytest.mark.long
@pytest.mark.parametrize("kind, bias, allow_rnn", [
    ("lstm", True, True), ("lstm", False, True), ("gru", True, True), ("rnn_tanh", True, True),
    ("lstm", True, False), ("gru", False, False),
], ids=["lstm", "lstm-no_bias", "gru", "rnn_tanh", "lstm-graph_break", "gru-no_bias-graph_break"])
def test_compiled_training_step(kind, bias, allow_rnn, fallbacks, fresh_dynamo):
    cpu = _Readout(_make(kind, seed=15, bidirectional=True, bias=bias))
    tpu = copy.deepcopy(cpu).to(TPU)
    cpu_opt = torch.optim.SGD(cpu.parameters(), lr=0.05)
    tpu_opt = torch.optim.SGD(tpu.parameters(), lr=0.05)

    @torch.compile(backend="tpu")
    def step(x):
        loss = tpu.loss(tpu(x))
        loss.backward()
        return loss

    before = metrics()
    fallbacks.reset()
    make = _seq_inputs(False, seed=15)
    with torch._dynamo.config.patch(allow_rnn=allow_rnn):
        for i in range(3):
            x = make(i)
            cpu_opt.zero_grad()
            tpu_opt.zero_grad()
            loss = cpu.loss(cpu(x))
            loss.backward()
            tpu_loss = step(x.to(TPU))
            rtol, atol = (1e-4, 1e-5) if i == 0 else (1e-3, 1e-4)
            _close(tpu_loss.detach(), loss.detach(), rtol=rtol, atol=atol, what=f"step {i} loss")
            problems = grad_mismatches(cpu, tpu, rtol=rtol, atol=atol)
            assert not problems, f"step {i}: " + "\n".join(problems[:8])
            cpu_opt.step()
            tpu_opt.step()
    fallbacks.assert_none("compiled training")
    after = metrics()
    if allow_rnn:
        assert after["graph_captures"] > before["graph_captures"], "nothing was compiled"
        assert after["graph_runs"] >= before["graph_runs"] + 3
