"""Parameter identity across device moves (tpu behaves as CUDA does).

PyTorch keeps a Parameter object, and so every tie between modules and every optimizer's
reference to it, across `Module.to(device)` only when `torch._has_compatible_shallow_copy_type`
says the old and the new tensor are interchangeable; for CUDA that holds against every dense
in-tree backend. These tests check the same for tpu through every path that relies on it:
`.to`/`.tpu()`/`.cpu()`, `.data =`, `to_empty`, `load_state_dict(assign=True)`, `swap_tensors`,
deepcopy, save/load, and optimizers and schedulers built before the move (trained 10 steps against
CPU, every parameter's gradient compared at every step).
"""
from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import grad_mismatches, run_python
from torch_pjrt import _models

TPU = torch.device("tpu")


class TiedLM(nn.Module):
    """Embedding shared with the output head (GPT-2/BERT style), plus an untied layer."""

    def __init__(self, vocab: int = 16, d: int = 8):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mid = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx):
        return self.head(torch.tanh(self.mid(self.emb(idx))))


def tied_model(seed: int = 0) -> TiedLM:
    return _models.init_weights(TiedLM(), seed=seed)


def param_ids(m: nn.Module) -> dict:
    return {name: id(p) for name, p in m.named_parameters(remove_duplicate=False)}


def test_issue_four_line_case():
    m = nn.Module()
    m.emb = nn.Embedding(10, 4)
    m.head = nn.Linear(4, 10, bias=False)
    m.head.weight = m.emb.weight
    t = m.to("tpu")
    assert t.head.weight is t.emb.weight
    assert t.emb.weight.device.type == "tpu"


@pytest.mark.parametrize("other", ["cpu", "tpu"])
def test_shallow_copy_compatibility_matches_cuda(other):
    # CUDA: dense CUDA <-> any dense in-tree backend is compatible; meta and sparse are not.
    t = torch.randn(3, device="tpu")
    o = torch.randn(3, device=other)
    assert torch._has_compatible_shallow_copy_type(t, o)
    assert torch._has_compatible_shallow_copy_type(o, t)
    meta = torch.empty(3, device="meta")
    assert not torch._has_compatible_shallow_copy_type(meta, t)
    assert not torch._has_compatible_shallow_copy_type(t, meta)
    sparse = torch.randn(3).to_sparse()
    assert not torch._has_compatible_shallow_copy_type(sparse, t)
    assert not torch._has_compatible_shallow_copy_type(t, sparse)
    # dtype does not matter (as for CPU and CUDA): `.half()` keeps Parameters too
    assert torch._has_compatible_shallow_copy_type(t, o.to(torch.int64))


@pytest.mark.parametrize("move_there, move_back", [
    (lambda m: m.to("tpu"), lambda m: m.to("cpu")),
    (lambda m: m.tpu(), lambda m: m.cpu()),
    (lambda m: m.to(device=TPU, dtype=torch.float64), lambda m: m.to("cpu", torch.float32)),
])
def test_module_moves_keep_parameters_and_ties(move_there, move_back):
    m = tied_model()
    before = param_ids(m)
    ref = {k: v.detach().clone() for k, v in m.state_dict().items()}
    assert move_there(m) is m
    assert param_ids(m) == before
    assert m.head.weight is m.emb.weight
    assert {p.device.type for p in m.parameters()} == {"tpu"}
    move_back(m)
    assert param_ids(m) == before and m.head.weight is m.emb.weight
    assert {(p.device.type, p.dtype) for p in m.parameters()} == {("cpu", torch.float32)}
    for k, v in m.state_dict().items():
        torch.testing.assert_close(v, ref[k], rtol=0, atol=0)


def test_grad_moves_with_parameter():
    m = tied_model()
    m(torch.tensor([[1, 2, 3]])).sum().backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.to("tpu")
    for n, p in m.named_parameters():
        assert p.grad.device == p.device == torch.device("tpu", 0), n
        torch.testing.assert_close(p.grad.cpu(), grads[n], rtol=0, atol=0)
    # backward on tpu accumulates into the moved gradients (the old CPU accumulator is gone)
    m(torch.tensor([[1, 2, 3]], device="tpu")).sum().backward()
    for n, p in m.named_parameters():
        torch.testing.assert_close(p.grad.cpu(), 2 * grads[n], rtol=1e-6, atol=1e-6)


def test_data_assignment_across_devices():
    p = nn.Parameter(torch.randn(3, 2))
    pid = id(p)
    p.data = torch.arange(6.0, device="tpu").view(3, 2)
    assert id(p) == pid and p.device == torch.device("tpu", 0) and p.requires_grad
    (p * 2).sum().backward()
    assert p.grad.device == p.device
    torch.testing.assert_close(p.grad.cpu(), torch.full((3, 2), 2.0))
    p.data = torch.ones(2, device="cpu")
    assert p.device.type == "cpu" and p.shape == (2,)
    # plain tensors too
    t = torch.zeros(2, device="tpu")
    t.data = torch.tensor([1.0, 2.0])
    assert t.device.type == "cpu"


def test_to_empty_as_cuda():
    m = tied_model()
    before = param_ids(m)
    m.to_empty(device="tpu")
    assert param_ids(m) == before and m.head.weight is m.emb.weight
    assert m.emb.weight.device.type == "tpu"
    # From meta, no device keeps identity (meta is never shallow-copy compatible, on CUDA
    # neither): the pattern of Parameter objects is the one the CPU target gives.
    with torch.device("meta"):
        a, b = TiedLM(), TiedLM()
    a.to_empty(device="tpu")
    b.to_empty(device="cpu")
    assert (a.head.weight is a.emb.weight) == (b.head.weight is b.emb.weight)
    assert a.emb.weight.device.type == "tpu"


def test_load_state_dict_assign_as_cpu():
    src = tied_model(seed=1)
    sd_tpu = {k: v.to("tpu") for k, v in src.state_dict().items()}
    sd_tpu["head.weight"] = sd_tpu["emb.weight"]  # the tie as a saved state dict has it
    a, b = tied_model(), tied_model()
    a.load_state_dict(sd_tpu, assign=True)
    b.load_state_dict(src.state_dict(), assign=True)
    assert (a.head.weight is a.emb.weight) == (b.head.weight is b.emb.weight)
    assert all(isinstance(p, nn.Parameter) and p.device.type == "tpu" for p in a.parameters())
    assert a.head.weight.untyped_storage().data_ptr() == a.emb.weight.untyped_storage().data_ptr()
    for k, v in a.state_dict().items():
        torch.testing.assert_close(v.cpu(), src.state_dict()[k], rtol=0, atol=0)
    # without assign: copied into the existing tpu Parameters, ties kept
    c = tied_model().to("tpu")
    before = param_ids(c)
    c.load_state_dict(src.state_dict())
    assert param_ids(c) == before and c.head.weight is c.emb.weight
    torch.testing.assert_close(c.emb.weight.cpu(), src.emb.weight.detach(), rtol=0, atol=0)


def test_swap_tensors_and_swap_on_conversion():
    a = nn.Parameter(torch.randn(3))
    b = nn.Parameter(torch.randn(3, device="tpu"))
    av, bv = a.detach().clone(), b.detach().cpu()
    torch.utils.swap_tensors(a, b)
    assert a.device.type == "tpu" and b.device.type == "cpu"
    torch.testing.assert_close(a.detach().cpu(), bv, rtol=0, atol=0)
    torch.testing.assert_close(b.detach(), av, rtol=0, atol=0)

    old = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        m = tied_model()
        m(torch.tensor([[1, 2]])).sum().backward()
        before = param_ids(m)
        m.to("tpu")
        assert param_ids(m) == before and m.head.weight is m.emb.weight
        assert all(p.device.type == "tpu" and p.grad.device.type == "tpu" for p in m.parameters())
    finally:
        torch.__future__.set_swap_module_params_on_conversion(old)


def test_deepcopy_keeps_ties_on_tpu():
    m = tied_model().to("tpu")
    d = copy.deepcopy(m)
    assert d.head.weight is d.emb.weight and d.emb.weight is not m.emb.weight
    assert d.emb.weight.device.type == "tpu"
    for (n, p), (_, q) in zip(m.named_parameters(), d.named_parameters()):
        torch.testing.assert_close(q.cpu(), p.cpu(), rtol=0, atol=0)
    with torch.no_grad():
        d.emb.weight.add_(1.0)  # independent storage: the original is unchanged
    assert not torch.equal(d.emb.weight.cpu(), m.emb.weight.cpu())


def _roundtrip(obj, **load_kw):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kw)


def test_save_load_keeps_ties():
    m = tied_model().to("tpu")
    ref = {k: v.cpu() for k, v in m.state_dict().items()}
    loaded = _roundtrip(m, weights_only=False)
    assert loaded.head.weight is loaded.emb.weight and loaded.emb.weight.device.type == "tpu"
    sd = _roundtrip(m.state_dict())
    assert sd["emb.weight"].device.type == "tpu"
    assert sd["emb.weight"].untyped_storage().data_ptr() == sd["head.weight"].untyped_storage().data_ptr()
    # a CPU checkpoint mapped onto tpu, and a tpu checkpoint mapped onto the CPU
    sd_from_cpu = _roundtrip(tied_model().state_dict(), map_location="tpu")
    assert sd_from_cpu["emb.weight"].device.type == "tpu"
    assert (sd_from_cpu["emb.weight"].untyped_storage().data_ptr()
            == sd_from_cpu["head.weight"].untyped_storage().data_ptr())
    sd_cpu = _roundtrip(m.state_dict(), map_location="cpu")
    for k, v in sd_cpu.items():
        assert v.device.type == "cpu"
        torch.testing.assert_close(v, ref[k], rtol=0, atol=0)
    fresh = tied_model(seed=5).to("tpu")
    fresh.load_state_dict(sd)
    assert fresh.head.weight is fresh.emb.weight
    torch.testing.assert_close(fresh.emb.weight.cpu(), ref["emb.weight"], rtol=0, atol=0)


def _train_steps(model, opt, sched, batches, device, grads_out):
    losses = []
    for x, y in batches:
        opt.zero_grad()
        out = model(x.to(device))
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.to(device).reshape(-1))
        loss.backward()
        grads_out.append({n: p.grad.detach().cpu().clone()
                          for n, p in model.named_parameters(remove_duplicate=False)})
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("opt_cls", [torch.optim.AdamW, torch.optim.SGD])
def test_optimizer_built_before_move_trains_tpu_parameters(opt_cls):
    g = torch.Generator().manual_seed(3)
    xs = [torch.randint(16, (4, 6), generator=g) for _ in range(10)]
    batches = [(x, (3 * x + 1) % 16) for x in xs]  # a mapping the model can learn
    kw = dict(lr=0.5, momentum=0.9) if opt_cls is torch.optim.SGD else dict(lr=0.05)

    def setup():
        m = tied_model(seed=7)
        opt = opt_cls(m.parameters(), **kw)
        return m, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)

    cpu_m, cpu_opt, cpu_sched = setup()
    tpu_m, tpu_opt, tpu_sched = setup()
    tpu_m.to("tpu")  # after the optimizer and the scheduler were built
    assert all(p.device.type == "tpu" for grp in tpu_opt.param_groups for p in grp["params"])
    cpu_grads, tpu_grads = [], []
    cpu_losses = _train_steps(cpu_m, cpu_opt, cpu_sched, batches, "cpu", cpu_grads)
    tpu_losses = _train_steps(tpu_m, tpu_opt, tpu_sched, batches, TPU, tpu_grads)
    assert cpu_losses[-1] < cpu_losses[0], "the CPU run did not learn: the test setup is wrong"
    torch.testing.assert_close(torch.tensor(tpu_losses), torch.tensor(cpu_losses),
                               rtol=1e-4, atol=1e-5)
    for step, (cg, tg) in enumerate(zip(cpu_grads, tpu_grads)):
        assert cg.keys() == tg.keys()
        for n in cg:
            torch.testing.assert_close(tg[n], cg[n], rtol=1e-4, atol=1e-5,
                                       msg=lambda m, n=n, s=step: f"step {s}, {n}: {m}")
    assert not grad_mismatches(cpu_m, tpu_m, rtol=1e-4, atol=1e-5)
    for (n, c), (_, t) in zip(cpu_m.named_parameters(), tpu_m.named_parameters()):
        torch.testing.assert_close(t.detach().cpu(), c.detach(), rtol=1e-4, atol=1e-5, msg=n)
    # the optimizer's state lives on tpu with its parameters
    for p, state in tpu_opt.state.items():
        assert p.device.type == "tpu"
        for k, v in state.items():
            if torch.is_tensor(v) and v.dim() > 0:
                assert v.device.type == "tpu", k


def test_moves_between_tpu_devices_keep_identity():
    r = run_python("""
        import torch
        from torch import nn
        assert torch.tpu.device_count() == 2, torch.tpu.device_count()
        m = nn.Module(); m.emb = nn.Embedding(10, 4); m.head = nn.Linear(4, 10, bias=False)
        m.head.weight = m.emb.weight
        ref = m.emb.weight.detach().clone()
        p = m.emb.weight
        m.to("tpu:0"); m.to("tpu:1")
        assert m.emb.weight is p and m.head.weight is p, "identity lost"
        assert p.device == torch.device("tpu", 1), p.device
        assert torch.equal(p.detach().cpu(), ref)
        print("ok")
    """, TORCH_PJRT_CPU_DEVICE_COUNT="2")
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("src_dev, dst_dev", [("tpu", "cpu"), ("cpu", "tpu")])
@pytest.mark.parametrize("what", ["tensor", "storage"])
def test_set_across_devices_raises_and_leaves_tensor_intact(src_dev, dst_dev, what):
    # `.data =` moves tensors between devices; set_ must not (CUDA raises the same error): a
    # CPU tensor holding a device storage would be corrupt.
    dst = torch.arange(3.0, device=dst_dev)
    src = torch.ones(4, device=src_dev)
    with pytest.raises(RuntimeError, match="the devices must match"):
        dst.set_(src if what == "tensor" else src.untyped_storage())
    assert dst.device.type == dst_dev and dst.shape == (3,)
    torch.testing.assert_close(dst.cpu(), torch.arange(3.0), rtol=0, atol=0)


@pytest.mark.parametrize("offset, size, stride", [(-1, (2,), (1,)), (0, (2, 2), (1,)), (3, (4,), (1,))])
def test_set_storage_bad_arguments_match_cpu(offset, size, stride):
    errors = []
    for dev in ("cpu", "tpu"):
        t = torch.zeros(4, device=dev)
        storage = torch.arange(4.0, device=dev).untyped_storage()
        with pytest.raises(RuntimeError) as info:
            t.set_(storage, offset, size, stride)
        errors.append(str(info.value).split("\n")[0])
        torch.testing.assert_close(t.cpu(), torch.zeros(4), rtol=0, atol=0)
    assert errors[0] == errors[1]
