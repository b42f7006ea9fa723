"""torch_pjrt.distributed.run_threads: ranks that are threads of one process, each on its own
tpu:<rank> and its own tpu_dist world (issue 36, item 3b).

Every case runs in a fresh interpreter with TORCH_PJRT_CPU_DEVICE_COUNT=4 (the device count is
fixed when the runtime starts): ``python tests/test_dist_threads.py CASE [ARGS]`` runs one case
function of this file and prints ``CASE OK``. Results are compared with the same computation on
CPU tensors in the same process.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _run_case(*argv: str, timeout: float = 150, env: dict | None = None) -> str:
    from torch_pjrt import _plugins

    if _plugins.resolve().name != "cpu":
        pytest.skip("several devices come from the CPU plugin (TORCH_PJRT_CPU_DEVICE_COUNT)")
    base = {**os.environ, "TORCH_PJRT_CPU_DEVICE_COUNT": "4", "PYTHONUNBUFFERED": "1"}
    base.pop("LOCAL_RANK", None)
    env = {**base, **(env or {})}
    r = subprocess.run([sys.executable, os.path.abspath(__file__), *argv], capture_output=True,
                       text=True, env=env, timeout=timeout, cwd=HERE)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert f"{argv[0]} OK" in r.stdout, out[-6000:]
    return r.stdout


# --- the cases (run in the child) ---------------------------------------------------------------


def _inp(rank: int, n: int = 12):
    """Rank `rank`'s input, on the CPU: distinct values per rank."""
    import torch

    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(n, generator=g) + 10 * rank


def case_collectives(world: str) -> None:
    """all_reduce, all_gather_into_tensor, reduce_scatter_tensor, broadcast, all_to_all_single,
    send/recv and a new_group on `world` thread ranks, each on tpu:<rank>; every result equal to
    the CPU computation over all ranks' inputs; results in rank order."""
    import torch
    import torch.distributed as dist

    from torch_pjrt.distributed import local_device, run_threads

    n = int(world)
    chunk = 3
    size = chunk * n

    def fn(rank, scale):
        dev = torch.device("tpu", rank)
        assert torch.tpu.current_device() == rank, torch.tpu.current_device()
        assert local_device() == dev, local_device()
        assert dist.get_rank() == rank and dist.get_world_size() == n
        # Ranks finish in reverse order: results still come back in rank order.
        time.sleep(0.05 * (n - 1 - rank))
        out = {"rank": rank, "scale": scale}
        x = _inp(rank, size).to("tpu")
        assert x.device == dev
        t = x.clone()
        dist.all_reduce(t)
        out["all_reduce"] = (t.device, t.cpu())
        g = torch.empty(size * n, device="tpu")
        dist.all_gather_into_tensor(g, x)
        out["all_gather"] = (g.device, g.cpu())
        rs = torch.empty(chunk, device="tpu")
        dist.reduce_scatter_tensor(rs, x)
        out["reduce_scatter"] = (rs.device, rs.cpu())
        b = x.clone()
        dist.broadcast(b, src=n - 1)
        out["broadcast"] = (b.device, b.cpu())
        a = torch.empty(size, device="tpu")
        dist.all_to_all_single(a, x)
        out["all_to_all"] = (a.device, a.cpu())
        # A ring of send/recv: even ranks send first, odd ones receive first.
        r = torch.empty(size, device="tpu")
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        if rank % 2 == 0:
            dist.send(x, nxt)
            dist.recv(r, prv)
        else:
            dist.recv(r, prv)
            dist.send(x, nxt)
        out["recv"] = (r.device, r.cpu())
        # A group of ranks 0 and 1 only (every rank calls new_group, as c10d requires).
        sub = dist.new_group([0, 1])
        if rank < 2:
            s = x.clone()
            dist.all_reduce(s, group=sub)
            out["sub"] = (s.device, s.cpu())
            assert dist.get_rank(sub) == rank and dist.get_world_size(sub) == 2
        return out

    results = run_threads(fn, n, 7)
    inputs = [_inp(r, size) for r in range(n)]
    total = torch.stack(inputs).sum(0)
    want = {
        "all_reduce": lambda r: total,
        "all_gather": lambda r: torch.cat(inputs),
        "reduce_scatter": lambda r: total[r * chunk:(r + 1) * chunk],
        "broadcast": lambda r: inputs[n - 1],
        "all_to_all": lambda r: torch.cat([inputs[s][r * chunk:(r + 1) * chunk]
                                           for s in range(n)]),
        "recv": lambda r: inputs[(r - 1) % n],
        "sub": lambda r: inputs[0] + inputs[1],
    }
    assert [res["rank"] for res in results] == list(range(n))
    assert all(res["scale"] == 7 for res in results)
    for r, res in enumerate(results):
        for key, expected in want.items():
            if key == "sub" and r >= 2:
                assert key not in res
                continue
            device, got = res[key]
            assert device == torch.device("tpu", r), (key, r, device)
            torch.testing.assert_close(got, expected(r), rtol=1e-6, atol=1e-5,
                                       msg=lambda m: f"{key}, rank {r}: {m}")
    # Nothing of the ranks' worlds is left in the calling thread.
    assert not dist.is_initialized()
    print("collectives OK")


def case_failure() -> None:
    """A rank's exception is raised in the caller with its rank named, the others are unblocked
    (not left waiting on it until the timeout), and run_threads and an ordinary
    init_process_group work afterwards."""
    import torch
    import torch.distributed as dist

    from torch_pjrt.distributed import run_threads

    multithreading = torch._C._is_multithreading_enabled()
    excepthook = sys.excepthook

    def fails_in_rank1(rank):
        x = torch.ones(4, device="tpu")
        dist.all_reduce(x)  # both ranks get this far
        if rank == 1:
            raise ValueError("rank one fails")
        dist.all_reduce(x)  # rank 0 waits on rank 1, which never comes
        return x.cpu()

    start = time.monotonic()
    with _raises(ValueError, "rank one fails") as exc:
        run_threads(fails_in_rank1, 2, timeout=60)
    took = time.monotonic() - start
    notes = " ".join(getattr(exc.value, "__notes__", []))
    assert "raised in rank 1 of 2" in notes, notes
    assert "rank 0:" in notes, notes  # rank 0's own failure (its peer went away) is named too
    assert took < 30, f"ranks were not unblocked: {took:.1f} s"

    # A failure while a peer waits in recv (send/recv, not a collective).
    def fails_in_rank0(rank):
        if rank == 0:
            raise KeyError("rank zero fails")
        r = torch.empty(3, device="tpu")
        dist.recv(r, 0)
        return r.cpu()

    start = time.monotonic()
    with _raises(KeyError, "rank zero fails") as exc:
        run_threads(fails_in_rank0, 2, timeout=60)
    assert "raised in rank 0 of 2" in " ".join(exc.value.__notes__)
    assert time.monotonic() - start < 30

    # c10d's process-wide state is back.
    assert not dist.is_initialized()
    assert torch._C._is_multithreading_enabled() == multithreading
    assert dist.distributed_c10d._world.__class__.__name__ == "_World"
    assert sys.excepthook is excepthook  # init_process_group's "[rank<r>]" wrapper removed

    # An ordinary init_process_group works afterwards, and a later run_threads works beside
    # it: the rank threads see their own 4-rank worlds, the process keeps its 1-rank one.
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    process_pg = dist.group.WORLD

    def ok(rank):
        assert dist.get_world_size() == 4 and dist.group.WORLD is not process_pg
        x = torch.full((2,), float(rank + 1), device="tpu")
        dist.all_reduce(x)
        return x.cpu()

    for got in run_threads(ok, 4):
        torch.testing.assert_close(got, torch.full((2,), 10.0))
    assert dist.group.WORLD is process_pg
    y = torch.ones(3)
    dist.all_reduce(y)
    assert dist.get_rank() == 0 and dist.get_world_size() == 1
    # The process's group resolves by name again (the registry is not per thread any more).
    name = dist.group.WORLD.group_name
    assert torch._C._distributed_c10d._resolve_process_group(name) is process_pg
    dist.destroy_process_group()
    print("failure OK")


class _raises:
    """pytest.raises for the child (no pytest import needed there): checks type and text."""

    def __init__(self, kind, text):
        self.kind, self.text, self.value = kind, text, None

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        assert value is not None, f"expected {self.kind.__name__}, nothing raised"
        if not isinstance(value, self.kind) or self.text not in str(value):
            return False  # the unexpected exception propagates
        self.value = value
        return True


def _tiny_model():
    """The same weights in every thread. Not torch.manual_seed: the default generator is one
    per process, so rank threads drawing from it concurrently would get different weights."""
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


def _batch():
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)


def _cpu_grads():
    """Single-device full-batch gradients on the CPU (mean loss over the batch)."""
    import torch

    model = _tiny_model()
    x, y = _batch()
    torch.nn.functional.mse_loss(model(x), y).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def case_ddp() -> None:
    """DDP on 2 thread ranks, each on half the batch: every parameter's gradient equals the
    single-device full-batch gradient on CPU."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from torch_pjrt.distributed import run_threads

    def fn(rank):
        model = _tiny_model().to("tpu")
        ddp = DDP(model, device_ids=None)
        x, y = _batch()
        half = slice(4 * rank, 4 * rank + 4)
        loss = torch.nn.functional.mse_loss(ddp(x[half].to("tpu")), y[half].to("tpu"))
        loss.backward()
        grads = {}
        for name, p in model.named_parameters():
            assert p.grad.device == torch.device("tpu", rank), (name, p.grad.device)
            grads[name] = p.grad.cpu()
        assert dist.get_world_size() == 2
        return grads

    want = _cpu_grads()
    for rank, grads in enumerate(run_threads(fn, 2)):
        assert grads.keys() == want.keys()
        for name in want:
            torch.testing.assert_close(grads[name], want[name], rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"rank {rank}, {name}: {m}")
    print("ddp OK")


def case_fsdp2() -> None:
    """FSDP2 (fully_shard) on 2 thread ranks, each on half the batch: every parameter is a
    DTensor sharded on tpu:<rank>, and its full gradient equals the single-device full-batch
    gradient on CPU."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from torch_pjrt.distributed import run_threads

    def fn(rank):
        mesh = init_device_mesh("tpu", (2,))
        model = _tiny_model().to("tpu")
        fully_shard(model[0], mesh=mesh)
        fully_shard(model[2], mesh=mesh)
        fully_shard(model, mesh=mesh)
        x, y = _batch()
        half = slice(4 * rank, 4 * rank + 4)
        loss = torch.nn.functional.mse_loss(model(x[half].to("tpu")), y[half].to("tpu"))
        loss.backward()
        grads = {}
        for name, p in model.named_parameters():
            assert p.to_local().device == torch.device("tpu", rank), name
            grads[name] = p.grad.full_tensor().cpu()
        return grads

    want = _cpu_grads()
    for rank, grads in enumerate(run_threads(fn, 2)):
        assert grads.keys() == want.keys()
        for name in want:
            torch.testing.assert_close(grads[name], want[name], rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"rank {rank}, {name}: {m}")
    print("fsdp2 OK")


def case_pipelining() -> None:
    """torch.distributed.pipelining, GPipe over 2 thread ranks (stage 0 = Linear-Tanh on tpu:0,
    stage 1 = Linear on tpu:1), 2 micro-batches: each micro-batch's loss equals the CPU loss of
    that half of the batch, and every stage parameter's gradient equals the single-device
    full-batch gradient on CPU (the schedule scales each micro-batch loss by 1/2)."""
    import torch
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    from torch_pjrt.distributed import run_threads

    def fn(rank):
        model = _tiny_model()
        part = (model[0:2] if rank == 0 else model[2:]).to("tpu")
        stage = PipelineStage(part, rank, 2, torch.device("tpu", rank))
        schedule = ScheduleGPipe(stage, n_microbatches=2,
                                 loss_fn=torch.nn.functional.mse_loss)
        x, y = _batch()
        losses = []
        if rank == 0:
            schedule.step(x.to("tpu"))
        else:
            schedule.step(target=y.to("tpu"), losses=losses)
        grads = {name: p.grad.cpu() for name, p in part.named_parameters()}
        assert all(p.device == torch.device("tpu", rank) for p in part.parameters())
        return grads, [loss.detach().cpu() for loss in losses]

    want = _cpu_grads()
    model, (x, y) = _tiny_model(), _batch()
    with torch.no_grad():
        want_losses = [torch.nn.functional.mse_loss(model(x[h]), y[h])
                       for h in (slice(0, 4), slice(4, 8))]
    (grads0, losses0), (grads1, losses1) = run_threads(fn, 2)
    assert sorted(grads0) == ["0.bias", "0.weight"] and sorted(grads1) == ["2.bias", "2.weight"]
    assert losses0 == [] and len(losses1) == 2
    for got, expected in zip(losses1, want_losses):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    for name, g in {**grads0, **grads1}.items():
        torch.testing.assert_close(g, want[name], rtol=1e-5, atol=1e-6,
                                   msg=lambda m: f"{name}: {m}")
    print("pipelining OK")


def case_dtensor() -> None:
    """DTensor over a 1-D mesh of 2 thread ranks: distribute_tensor as Shard(0) gives each rank
    its torch.chunk row block on tpu:<rank>, and redistribute to Replicate gives the full tensor."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from torch_pjrt.distributed import run_threads

    full = torch.arange(35, dtype=torch.float32).reshape(7, 5) / 3  # uneven shards: 4 and 3 rows

    def fn(rank):
        mesh = init_device_mesh("tpu", (2,), mesh_dim_names=("dp",))
        assert mesh.get_local_rank() == rank
        d = distribute_tensor(full.to("tpu"), mesh, [Shard(0)])
        local = d.to_local()
        assert local.device == torch.device("tpu", rank)
        r = d.redistribute(mesh, [Replicate()])
        assert r.placements == (Replicate(),)
        s = (d * 2).sum()  # a Partial result made whole
        return local.cpu(), r.to_local().cpu(), d.full_tensor().cpu(), s.full_tensor().cpu()

    results = run_threads(fn, 2)
    for rank, (local, replicated, gathered, total) in enumerate(results):
        assert torch.equal(local, torch.chunk(full, 2)[rank])
        assert torch.equal(replicated, full)
        assert torch.equal(gathered, full)
        torch.testing.assert_close(total, (full * 2).sum())
    print("dtensor OK")


# --- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 4])
def test_collectives(world):
    # LOCAL_RANK names a process's device under torchrun; rank threads must ignore it.
    _run_case("collectives", str(world), env={"LOCAL_RANK": "1"} if world == 2 else {})


def test_failure_raises_names_rank_and_recovers():
    _run_case("failure")


def test_ddp_gradients_match_cpu():
    _run_case("ddp")


def test_fsdp2_gradients_match_cpu():
    _run_case("fsdp2")


def test_pipelining_gpipe_matches_cpu():
    _run_case("pipelining")


def test_dtensor_shard_replicate():
    _run_case("dtensor")


def test_not_enough_devices():
    """In this process (one device unless the environment says otherwise) asking for more ranks
    than devices is refused before any thread starts, naming TORCH_PJRT_CPU_DEVICE_COUNT."""
    import torch

    from torch_pjrt.distributed import run_threads

    n = torch.tpu.device_count() + 1
    with pytest.raises(ValueError, match="TORCH_PJRT_CPU_DEVICE_COUNT"):
        run_threads(lambda rank: rank, n)
    with pytest.raises(ValueError, match="world_size"):
        run_threads(lambda rank: rank, 0)


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    import torch  # noqa: F401  (loads torch_pjrt)

    globals()["case_" + sys.argv[1]](*sys.argv[2:])
