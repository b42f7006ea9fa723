"""Collectives among the devices of one process (torch_pjrt/distributed/local.py, issue 36 item
3(a)): one program over the devices, no process group, no host copy; torch.nn.parallel.comm and
nn.DataParallel on tpu devices on top of them. Values against the same computation on the CPU.

The device count is fixed when the runtime starts: each group runs in a fresh interpreter with
TORCH_PJRT_CPU_DEVICE_COUNT=4 and prints "ok" last."""
from __future__ import annotations

import textwrap

from conftest import run_python

PRELUDE = """
import copy
import torch
import torch_pjrt  # noqa: F401
from torch.testing import assert_close
from torch_pjrt.distributed import local

def raises(exc, fn, match):
    try:
        fn()
    except exc as e:
        assert match in str(e), (match, str(e))
        return
    raise AssertionError(f"expected {exc.__name__}")

def host_reads():
    return torch.tpu.metrics()["transfers_to_host"]

DEVS = [f"tpu:{i}" for i in range(4)]
"""


def _run(code: str) -> None:
    r = run_python(PRELUDE + textwrap.dedent(code), TORCH_PJRT_CPU_DEVICE_COUNT="4")
    assert r.stdout.strip().splitlines()[-1:] == ["ok"], r.stdout[-3000:] + r.stderr[-3000:]


def test_every_kind_against_cpu():
    _run("""
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.int32, torch.bfloat16):
        cpu = [(torch.randn(3, 5, generator=g) * 10).to(dtype) for _ in DEVS]
        xs = [c.to(d) for c, d in zip(cpu, DEVS)]
        before = host_reads()
        total = local.all_reduce(xs)
        biggest = local.all_reduce(xs, op="max")
        at2 = local.reduce(xs, root=2)
        gathered = local.all_gather(xs)
        assert host_reads() == before  # nothing read to the host
        for i, d in enumerate(DEVS):
            assert total[i].device == torch.device(d) and gathered[i].device == torch.device(d)
            # float sums in another order than a left fold: compare with tolerance
            assert_close(total[i].cpu(), sum(cpu[1:], cpu[0]), rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-5)
            assert_close(biggest[i].cpu(), torch.stack(cpu).amax(0))
            assert_close(gathered[i].cpu(), torch.cat(cpu))
        assert at2.device == torch.device("tpu:2")
        assert_close(at2.cpu(), total[2].cpu())
        # the inputs are unchanged
        for c, x in zip(cpu, xs):
            assert torch.equal(x.cpu(), c)
    ints = [torch.tensor([0b1100, 0b1010], dtype=torch.int32, device=d) + i for i, d in enumerate(DEVS)]
    assert local.all_reduce(ints, op="band")[1].cpu().tolist() == [12 & 13 & 14 & 15, 10 & 11 & 12 & 13]
    assert local.all_reduce(ints, op="product")[0].cpu().tolist() == [12 * 13 * 14 * 15, 10 * 11 * 12 * 13]
    # views: the same view on every device is read in place, different views are copied first
    base = [torch.arange(12.0, device=d).view(3, 4) * (i + 1) for i, d in enumerate(DEVS)]
    assert_close(local.all_reduce([b.t() for b in base])[3].cpu(), torch.arange(12.0).view(3, 4).t() * 10)
    mixed = [b[:, 1:3] if i % 2 else b.t()[1:3].t() for i, b in enumerate(base)]
    want = sum(m.cpu() for m in mixed)
    assert_close(local.all_reduce(mixed)[0].cpu(), want)
    # a 0-d value gathers into [n]
    assert local.all_gather([torch.tensor(float(i), device=d) for i, d in enumerate(DEVS)])[0].cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    print("ok")
    """)


def test_bad_input_raises():
    _run("""
    a, b = torch.ones(2, device="tpu:0"), torch.ones(2, device="tpu:1")
    raises(ValueError, lambda: local.all_reduce([a, a]), "both on tpu:0")
    raises(ValueError, lambda: local.all_reduce([a, torch.ones(3, device="tpu:1")]), "dtype and shape")
    raises(ValueError, lambda: local.all_reduce([a, b.int()]), "dtype and shape")
    raises(ValueError, lambda: local.all_reduce([a, torch.ones(2)]), "not a tpu device")
    raises(ValueError, lambda: local.all_reduce([a, b], op="mean"), "unknown reduce op")
    raises(ValueError, lambda: local.all_reduce([]), "1 to")
    # the process goes on: a good call after the bad ones
    assert local.all_reduce([a, b])[1].cpu().tolist() == [2.0, 2.0]
    print("ok")
    """)


def test_parallel_comm_functions():
    _run("""
    import torch.nn.parallel.comm as comm
    x = torch.arange(10.0, device="tpu:1").view(2, 5)
    before = host_reads()
    copies = comm.broadcast(x, [1, 0, 3])
    assert [c.device.index for c in copies] == [1, 0, 3] and copies[0] is x
    w, b, n = torch.randn(4, 3).to("tpu:0"), torch.randn(3).to("tpu:0"), torch.arange(5, device="tpu:0")
    per_device = comm.broadcast_coalesced([w, b, n], [0, 2, 3])
    assert per_device[0][0] is w and per_device[0][2] is n  # the source's own tensors
    total = comm.reduce_add([torch.full((3,), float(i + 1), device=d) for i, d in enumerate(DEVS)], destination=2)
    elsewhere = comm.reduce_add([torch.ones(2, device=d) for d in DEVS[1:]], destination=0)
    chunks = comm.scatter(torch.arange(10.0, device="tpu:0"), [0, 1, 2], chunk_sizes=[3, 3, 4])
    back = comm.gather(list(chunks), dim=0, destination=3)
    assert host_reads() == before
    for c in copies:
        assert torch.equal(c.cpu(), x.cpu())
    for k, dev in enumerate([0, 2, 3]):
        assert [t.device.index for t in per_device[k]] == [dev] * 3
        assert torch.equal(per_device[k][0].cpu(), w.cpu()) and torch.equal(per_device[k][1].cpu(), b.cpu())
        assert per_device[k][2].dtype == torch.int64 and torch.equal(per_device[k][2].cpu(), n.cpu())
    assert total.device.index == 2 and total.cpu().tolist() == [10.0] * 3
    assert elsewhere.device.index == 0 and elsewhere.cpu().tolist() == [3.0, 3.0]
    assert [c.device.index for c in chunks] == [0, 1, 2] and [len(c) for c in chunks] == [3, 3, 4]
    assert back.device.index == 3 and back.cpu().tolist() == list(range(10))
    # what DataParallel's scatter calls after its copies: nothing to record (PJRT keeps a
    # buffer alive while programs use it), a tpu stream accepted
    chunks[1].record_stream(torch.tpu.current_stream(1))
    # CPU tensors keep PyTorch's own functions (and their errors)
    raises(AssertionError, lambda: comm.reduce_add([torch.ones(2), torch.ones(2)]), "on GPUs")
    print("ok")
    """)


def test_data_parallel_training_matches_cpu():
    """nn.DataParallel over the 4 devices: 3 SGD steps; every step's loss, every parameter's
    gradient and every parameter afterwards equal the single-device CPU run, and the steps read
    nothing to the host but the losses."""
    _run("""
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    model = copy.deepcopy(cpu).to("tpu:0")
    dp = torch.nn.DataParallel(model)
    assert dp.device_ids == [0, 1, 2, 3]
    copt = torch.optim.SGD(cpu.parameters(), lr=0.1)
    topt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        x, y = torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)
        copt.zero_grad()
        want = torch.nn.functional.mse_loss(cpu(x), y)
        want.backward()
        topt.zero_grad()
        before = host_reads()
        out = dp(x.to("tpu:0"))
        assert out.device == torch.device("tpu:0")
        loss = torch.nn.functional.mse_loss(out, y.to("tpu:0"))
        loss.backward()
        for (name, p), q in zip(model.named_parameters(), cpu.parameters()):
            assert p.grad.device == torch.device("tpu:0"), name
        assert host_reads() == before
        assert_close(loss.item(), want.item(), rtol=1e-5, atol=1e-6)
        for (name, p), q in zip(model.named_parameters(), cpu.parameters()):
            assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
        copt.step()
        topt.step()
    for p, q in zip(model.parameters(), cpu.parameters()):
        assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)
    # a CPU batch is scattered to the devices too
    assert_close(dp(x).cpu(), cpu(x).detach(), rtol=1e-5, atol=1e-6)
    print("ok")
    """)
