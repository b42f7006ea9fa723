"""torch_pjrt.distributed.run_threads: ranks that are threads of one process, each on its own
tpu:<rank> and its own tpu_dist world (issue 36, item 3b).

Every case runs in a fresh interpreter with TORCH_PJRT_CPU_DEVICE_COUNT=4 (the device count is
fixed when the runtime starts): ``python tests/test_dist_threads.py CASE [ARGS]`` runs one case
function of this file and prints ``CASE OK``. Results are compared with the same computation on
CPU tensors in the same process.
"""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


# The transports a case runs over: unset (rank threads then get the native one, which each
# case checks with torch_pjrt.distributed.transport()) and the Gloo-staged one, forced.
TRANSPORTS = ["native", "staged"]


def _run_case(*argv: str, timeout: float = 150, env: dict | None = None,
              transport: str = "native") -> str:
    from torch_pjrt import _plugins

    if _plugins.resolve().name != "cpu":
        pytest.skip("several devices come from the CPU plugin (TORCH_PJRT_CPU_DEVICE_COUNT)")
    # The child imports torch_pjrt from this checkout (an installed one may be another's).
    root = os.path.dirname(HERE)
    path = root + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    base = {**os.environ, "TORCH_PJRT_CPU_DEVICE_COUNT": "4", "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": path, "EXPECT_TRANSPORT": transport}
    base.pop("LOCAL_RANK", None)
    base.pop("TORCH_PJRT_DIST_TRANSPORT", None)
    if transport != "native":
        base["TORCH_PJRT_DIST_TRANSPORT"] = transport
    env = {**base, **(env or {})}
    r = subprocess.run([sys.executable, os.path.abspath(__file__), *argv], capture_output=True,
                       text=True, env=env, timeout=timeout, cwd=HERE)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert f"{argv[0]} OK" in r.stdout, out[-6000:]
    return r.stdout


# --- the cases (run in the child) ---------------------------------------------------------------


def _check_transport(group=None) -> None:
    """The group runs over the transport the test asked for (native: chosen automatically)."""
    import torch_pjrt
    from torch_pjrt.distributed import transport

    assert os.path.dirname(torch_pjrt.__file__) == os.path.join(os.path.dirname(HERE),
                                                                "torch_pjrt"), torch_pjrt.__file__
    want = os.environ["EXPECT_TRANSPORT"]
    assert transport(group) == want, (transport(group), want)


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
        _check_transport()
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
    # Gloo's worker thread drops its reference to the all_reduce's work, and so to y, a moment
    # after the caller's wait returns. Should y's Python object die first, that last reference
    # frees it and needs the GIL, which a worker thread cannot get once the interpreter is
    # exiting: the process aborts (std::terminate in PyTorch's Gloo runloop, seen under load,
    # stop 58's CI). Freeing the group (process_pg is also ok's closure cell) joins Gloo's
    # threads while y is alive.
    del process_pg
    gc.collect()
    del y
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


def case_fsdp2_tp() -> None:
    """FSDP2 over dp and tensor parallelism over tp on a 2x2 mesh of 4 thread ranks (the
    first Linear column-wise, the second row-wise): every parameter's full gradient equals the
    single-device full-batch gradient on CPU. DTensor's sharding propagation runs fake tensors
    in every rank thread at once."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    from torch_pjrt.distributed import run_threads

    def fn(rank):
        mesh = init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))
        model = _tiny_model().to("tpu")
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(model, mesh=mesh["dp"])
        x, y = _batch()
        dp = mesh["dp"].get_local_rank()
        half = slice(4 * dp, 4 * dp + 4)
        loss = torch.nn.functional.mse_loss(model(x[half].to("tpu")), y[half].to("tpu"))
        loss.backward()
        return {name: p.grad.full_tensor().cpu() for name, p in model.named_parameters()}

    want = _cpu_grads()
    for rank, grads in enumerate(run_threads(fn, 4)):
        assert grads.keys() == want.keys()
        for name in want:
            torch.testing.assert_close(grads[name], want[name], rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"rank {rank}, {name}: {m}")
    print("fsdp2_tp OK")


def _expect_grads(results, want) -> None:
    import torch

    for rank, grads in enumerate(results):
        assert grads.keys() == want.keys(), (grads.keys(), want.keys())
        for name in want:
            torch.testing.assert_close(grads[name], want[name], rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"rank {rank}, {name}: {m}")


def case_compiled_ranks(world: str) -> None:
    """`world` rank threads each compile their own model with backend="tpu" and train it at
    once (no collective): every rank's loss and gradients equal CPU's for its own input, and
    every graph is captured whole (one rank's ops never enter, nor break, another rank's
    capture). The ranks' captures are made to overlap: each rank, having begun a capture,
    waits for every other rank to have begun one too, so all graphs are recorded at once.
    Before captures were per thread, the second rank's begin raised "a graph capture is
    already in progress" (and a rank's op during another's capture broke it)."""
    import threading

    import torch
    import torch_pjrt.device

    from torch_pjrt.distributed import run_threads

    world = int(world)
    x, y = _batch()
    all_capturing = threading.Barrier(world, timeout=60)
    C = torch_pjrt.device._C
    begin = C._capture_begin

    def begin_together(*args, **kwargs):
        begin(*args, **kwargs)
        all_capturing.wait()

    C._capture_begin = begin_together

    def fn(rank):
        model = _tiny_model().to("tpu")
        step = torch.compile(model, backend="tpu")
        for _ in range(3):
            model.zero_grad()
            loss = torch.nn.functional.mse_loss(step(x.to("tpu") * (rank + 1)), y.to("tpu"))
            loss.backward()
        return loss.item(), {name: p.grad.cpu() for name, p in model.named_parameters()}

    before = torch.tpu.metrics()
    try:
        results = run_threads(fn, world)
    finally:
        C._capture_begin = begin
    after = torch.tpu.metrics()
    for rank, (loss, grads) in enumerate(results):
        model = _tiny_model()
        want = torch.nn.functional.mse_loss(model(x * (rank + 1)), y)
        want.backward()
        assert abs(loss - want.item()) <= 1e-5 * abs(want.item()) + 1e-6, (rank, loss, want)
        _expect_grads([grads], {name: p.grad for name, p in model.named_parameters()})
    # a forward and a backward graph per rank, each captured once and never broken
    assert after["graph_captures"] - before["graph_captures"] == 2 * world, (before, after)
    assert after["graph_captures_broken"] == before["graph_captures_broken"], (before, after)
    assert after["graph_runs"] - before["graph_runs"] >= 2 * world * 2
    print("compiled_ranks OK")


def case_fsdp2_compiled() -> None:
    """FSDP2 with compiled blocks, as torchtitan applies them (each block torch.compile'd, then
    fully_shard'ed; FSDP's hooks run eagerly around the compiled forward): every parameter's
    full gradient equals the single-device full-batch gradient on CPU, over two steps, and
    each block's forward and backward are captured programs on every rank."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from torch_pjrt.distributed import run_threads

    def fn(rank):
        mesh = init_device_mesh("tpu", (2,))
        model = _tiny_model().to("tpu")
        for i in (0, 2):
            model[i] = torch.compile(model[i], backend="tpu")
            fully_shard(model[i], mesh=mesh)
        fully_shard(model, mesh=mesh)
        x, y = _batch()
        half = slice(4 * rank, 4 * rank + 4)
        for _ in range(2):
            model.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x[half].to("tpu")), y[half].to("tpu"))
            loss.backward()
        _check_transport()
        return {name.replace("._orig_mod", ""): p.grad.full_tensor().cpu()
                for name, p in model.named_parameters()}

    before = torch.tpu.metrics()
    results = run_threads(fn, 2)
    after = torch.tpu.metrics()
    _expect_grads(results, _cpu_grads())
    # 2 blocks x (forward, backward) x 2 ranks
    assert after["graph_captures"] - before["graph_captures"] == 8, (before, after)
    assert after["graph_captures_broken"] == before["graph_captures_broken"]
    print("fsdp2_compiled OK")


def case_tp_compiled(world: str = "2") -> None:
    """Tensor parallelism (column-wise then row-wise Linear) under torch.compile: the graphs
    hold DTensor's functional collectives (_c10d_functional.all_reduce and wait_tensor). On the
    native transport each graph is captured with its collectives inside, one SPMD program over
    the group's devices run through the group's rendezvous: after the first step every call is
    one program run (graph_runs), nothing goes through the recorder (defer_ops) and no
    collective runs on its own. On the staged transport the collectives run through Gloo
    between the graph's pieces (the graph runs through the recorder). Every parameter's full
    gradient equals the single-device gradient on CPU, over three steps."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    from torch_pjrt.distributed import run_threads

    n = int(world)

    def fn(rank):
        # 4 ranks: the "tp" dimension of a 2x2 mesh, two sub-groups each running its own
        # programs over its two devices
        mesh = (init_device_mesh("tpu", (2,)) if n == 2 else
                init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))["tp"])
        model = _tiny_model().to("tpu")
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        step = torch.compile(model, backend="tpu")
        x, y = _batch()
        for i in range(3):
            if i == 1:  # every rank past its first step: graphs captured (or not)
                torch.distributed.barrier()
                before = torch.tpu.metrics()
            model.zero_grad()
            torch.nn.functional.mse_loss(step(x.to("tpu")), y.to("tpu")).backward()
        torch.distributed.barrier()
        after = torch.tpu.metrics()
        _check_transport()
        grads = {name: p.grad.full_tensor().cpu() for name, p in model.named_parameters()}
        return grads, {k: after[k] - before[k] for k in ("graph_runs", "defer_ops")}

    from torch._dynamo.utils import counters

    results = run_threads(fn, n)
    _expect_grads([g for g, _ in results], _cpu_grads())
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"], counters
    # metrics are process-wide: the window holds this rank's two steps, a forward and a
    # backward graph each, and what the other rank ran meanwhile
    delta = results[0][1]
    if os.environ["EXPECT_TRANSPORT"] == "native":
        assert delta["graph_runs"] >= 4 and delta["defer_ops"] == 0, delta
    else:
        assert delta["defer_ops"] > 0, delta
    print("tp_compiled OK")


def case_spmd_mismatch() -> None:
    """Two ranks compile different graphs around a functional all_reduce (native transport):
    each graph is captured as a program over the group's devices, and before it runs the ranks'
    programs are compared: both ranks raise an error naming each rank's compiled graph, within
    the timeout, instead of running mismatched programs or hanging."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    from torch_pjrt.distributed import run_threads

    def fn(rank):
        _check_transport()
        group = dist.group.WORLD

        def f0(x):
            return funcol.all_reduce(x * 2, "sum", group)

        def f1(x):
            return funcol.all_reduce(x + 1, "sum", group) - 3

        f = torch.compile(f0 if rank == 0 else f1, backend="tpu", fullgraph=True)
        start = time.monotonic()
        try:
            f(torch.ones(4, device="tpu")).cpu()
        except Exception as e:  # noqa: BLE001 (the message is checked)
            return str(e), time.monotonic() - start
        return "nothing raised", 0.0

    for rank, (msg, took) in enumerate(run_threads(fn, 2, timeout=20)):
        assert "rank 0 called a compiled graph of" in msg, msg
        assert "rank 1 called a compiled graph of" in msg, msg
        assert took < 10, took
    print("spmd_mismatch OK")


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


def _vals(rank: int, n: int, dtype):
    """Rank `rank`'s values, exact in every dtype here (small integers; bool alternates)."""
    import torch

    base = (torch.arange(n) * 3 + 5 * rank) % 7 + 1
    if dtype == torch.bool:
        return (base + rank) % 2 == 0
    return base.to(dtype)


def case_native_kinds(world: str) -> None:
    """Every collective of c10d on the native transport against the same computation on CPU
    tensors, each result on tpu:<rank>."""
    import torch
    import torch.distributed as dist

    from torch_pjrt.distributed import run_threads

    n = int(world)
    f32 = torch.float32
    dtypes = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.uint8, torch.bool]
    R = dist.ReduceOp

    def fn(rank):
        _check_transport()
        out = {}
        dev = torch.device("tpu", rank)

        def put(key, t):
            assert t.device == dev, (key, t.device)
            out[key] = t.cpu()

        # No host transfer: a native all_reduce moves nothing through the host. The counters
        # are the process's: the barriers keep the other ranks from transferring meanwhile.
        x = _vals(rank, 6, f32).to("tpu")
        torch.tpu.synchronize()
        dist.barrier()
        before = dict(torch.tpu.metrics())
        dist.all_reduce(x)
        torch.tpu.synchronize()
        after = dict(torch.tpu.metrics())
        dist.barrier()
        for k in ("transfers_to_device", "transfers_to_host", "bytes_to_device",
                  "bytes_to_host", "transfers_device_to_device"):
            out["metric_" + k] = after[k] - before[k]
        put("all_reduce", x)
        for dt in dtypes:  # SUM (bool: or) and all_gather in every dtype
            t = _vals(rank, 5, dt).to("tpu")
            dist.all_reduce(t)
            put(f"all_reduce_{dt}", t)
            g = [torch.empty(5, dtype=dt, device="tpu") for _ in range(n)]
            dist.all_gather(g, _vals(rank, 5, dt).to("tpu"))
            put(f"all_gather_{dt}", torch.stack(g))
        for op in (R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX):
            t = _vals(rank, 4, f32).to("tpu")
            dist.all_reduce(t, op=op)
            put(f"op_{op}_f32", t)
        for op in (R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR):
            t = _vals(rank, 4, torch.int64).to("tpu")
            dist.all_reduce(t, op=op)
            put(f"op_{op}_i64", t)
        t = _vals(rank, 4, f32).to("tpu")
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
        put("premul", t)
        # rooted
        b = _vals(rank, 4, f32).to("tpu")
        dist.broadcast(b, src=n - 1)
        put("broadcast", b)
        r = _vals(rank, 4, f32).to("tpu")
        dist.reduce(r, dst=1)
        put("reduce", r)
        gl = [torch.empty(3, device="tpu") for _ in range(n)] if rank == 0 else None
        dist.gather(_vals(rank, 3, f32).to("tpu"), gl, dst=0)
        if rank == 0:
            put("gather", torch.stack(gl))
        sc = torch.empty(3, device="tpu")
        dist.scatter(sc, [(_vals(q, 3, f32) * 10).to("tpu") for q in range(n)] if rank == 1
                     else None, src=1)
        put("scatter", sc)
        # tensor forms
        g = torch.empty(n * 4, device="tpu")
        dist.all_gather_into_tensor(g, _vals(rank, 4, f32).to("tpu"))
        put("all_gather_into_tensor", g)
        rs = torch.empty(2, device="tpu")
        dist.reduce_scatter_tensor(rs, _vals(rank, 2 * n, f32).to("tpu"))
        put("reduce_scatter_tensor", rs)
        rl = torch.empty(2, device="tpu")
        dist.reduce_scatter(rl, [_vals(rank + q, 2, f32).to("tpu") for q in range(n)])
        put("reduce_scatter", rl)
        # FSDP2's form: the input a view of the output at this rank's shard
        buf = torch.zeros(n * 3, device="tpu")
        buf[rank * 3:(rank + 1) * 3] = _vals(rank, 3, f32).to("tpu")
        dist.all_gather_into_tensor(buf, buf[rank * 3:(rank + 1) * 3])
        put("all_gather_in_place", buf)
        # all_to_all: even, uneven splits, lists of different sizes
        a = torch.empty(2 * n, device="tpu")
        dist.all_to_all_single(a, _vals(rank, 2 * n, f32).to("tpu"))
        put("all_to_all_even", a)
        ins = [q + 1 for q in range(n)]  # rank sends q+1 rows to rank q (plus rank rows)
        send = [q + 1 + rank for q in range(n)]
        recv = [rank + 1 + q for q in range(n)]
        ua = torch.empty(sum(recv), 2, device="tpu")
        dist.all_to_all_single(ua, _vals(rank, 2 * sum(send), f32).view(-1, 2).to("tpu"),
                               output_split_sizes=recv, input_split_sizes=send)
        put("all_to_all_uneven", ua)
        del ins
        lo = [torch.empty(q + rank + 1, device="tpu") for q in range(n)]
        dist.all_to_all(lo, [_vals(rank * n + q, rank + q + 1, f32).to("tpu") for q in range(n)])
        put("all_to_all_list", torch.cat(lo))
        dist.barrier()
        # views: a transposed (non-contiguous) all_reduce, a strided all_gather input
        m = _vals(rank, 6, f32).view(2, 3).to("tpu").t()
        dist.all_reduce(m)
        put("transposed", m.contiguous())
        big = _vals(rank, 8, f32).to("tpu")
        sg = torch.empty(n * 4, device="tpu")
        dist.all_gather_into_tensor(sg, big[::2])
        put("strided_gather", sg)
        part = _vals(rank, 8, f32).to("tpu")
        dist.all_reduce(part[2:5])
        put("view_all_reduce", part)
        # async: the Work completes, wait() returns, the future holds the output
        w = dist.all_reduce(t2 := _vals(rank, 3, f32).to("tpu"), async_op=True)
        w.wait()
        assert w.is_completed()
        put("async", w.get_future().wait()[0])
        del t2
        # send/recv pair and a sub-group of ranks 0 and n-1
        if rank == 0:
            dist.send(_vals(7, 3, f32).to("tpu"), n - 1)
        elif rank == n - 1:
            p = torch.empty(3, device="tpu")
            dist.recv(p, 0)
            put("recv", p)
        sub = dist.new_group([0, n - 1])
        if rank in (0, n - 1):
            _check_transport(sub)
            s = _vals(rank, 3, f32).to("tpu")
            dist.all_reduce(s, group=sub)
            put("sub", s)
        if n == 4:  # a 2x2 mesh: rows {0,1},{2,3}, columns {0,2},{1,3}
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))
            for dim in ("dp", "tp"):
                _check_transport(mesh.get_group(dim))
                s = _vals(rank, 3, f32).to("tpu")
                dist.all_reduce(s, group=mesh.get_group(dim))
                put(f"mesh_{dim}", s)
        return out

    results = run_threads(fn, n)

    def each(dt, k):
        return [_vals(q, k, dt) for q in range(n)]

    def reduce(op, vs):
        acc = vs[0].clone()
        for v in vs[1:]:
            if op == R.PRODUCT:
                acc = acc * v
            elif op == R.MIN:
                acc = torch.minimum(acc, v)
            elif op == R.MAX:
                acc = torch.maximum(acc, v)
            elif op == R.BAND:
                acc = acc & v
            elif op == R.BOR:
                acc = acc | v
            elif op == R.BXOR:
                acc = acc ^ v
            else:
                acc = acc + v
        return acc / n if op == R.AVG else acc

    for rank, res in enumerate(results):
        want = {"all_reduce": reduce(R.SUM, each(f32, 6))}
        for dt in dtypes:
            vs = each(dt, 5)
            want[f"all_reduce_{dt}"] = (torch.stack(vs).any(0) if dt == torch.bool
                                        else reduce(R.SUM, vs).to(dt))
            want[f"all_gather_{dt}"] = torch.stack(vs)
        for op in (R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX):
            want[f"op_{op}_f32"] = reduce(op, each(f32, 4))
        for op in (R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR):
            want[f"op_{op}_i64"] = reduce(op, each(torch.int64, 4))
        want["premul"] = reduce(R.SUM, each(f32, 4)) * 0.5
        want["broadcast"] = _vals(n - 1, 4, f32)
        want["reduce"] = reduce(R.SUM, each(f32, 4)) if rank == 1 else _vals(rank, 4, f32)
        if rank == 0:
            want["gather"] = torch.stack(each(f32, 3))
        want["scatter"] = _vals(rank, 3, f32) * 10
        want["all_gather_into_tensor"] = torch.cat(each(f32, 4))
        want["reduce_scatter_tensor"] = reduce(R.SUM, each(f32, 2 * n))[2 * rank:2 * rank + 2]
        want["reduce_scatter"] = reduce(R.SUM, [_vals(q + rank, 2, f32) for q in range(n)])
        want["all_gather_in_place"] = torch.cat(each(f32, 3))
        want["all_to_all_even"] = torch.cat([_vals(q, 2 * n, f32)[2 * rank:2 * rank + 2]
                                             for q in range(n)])
        chunks = []
        for q in range(n):  # rank q sends [q+1+r rows for r] of its [sum, 2] input
            send_q = [r + 1 + q for r in range(n)]
            x = _vals(q, 2 * sum(send_q), f32).view(-1, 2)
            off = sum(send_q[:rank])
            chunks.append(x[off:off + send_q[rank]])
        want["all_to_all_uneven"] = torch.cat(chunks)
        want["all_to_all_list"] = torch.cat([_vals(q * n + rank, q + rank + 1, f32)
                                             for q in range(n)])
        want["transposed"] = reduce(R.SUM, [v.view(2, 3).t() for v in each(f32, 6)])
        want["strided_gather"] = torch.cat([v[::2] for v in each(f32, 8)])
        part = _vals(rank, 8, f32).clone()
        part[2:5] = reduce(R.SUM, [v[2:5] for v in each(f32, 8)])
        want["view_all_reduce"] = part
        want["async"] = reduce(R.SUM, each(f32, 3))
        if rank == n - 1:
            want["recv"] = _vals(7, 3, f32)
        if rank in (0, n - 1):
            want["sub"] = _vals(0, 3, f32) + _vals(n - 1, 3, f32)
        if n == 4:
            row, col = [rank // 2 * 2, rank // 2 * 2 + 1], [rank % 2, rank % 2 + 2]
            want["mesh_dp"] = sum(_vals(q, 3, f32) for q in col)
            want["mesh_tp"] = sum(_vals(q, 3, f32) for q in row)
        for key, expected in want.items():
            assert key in res, (key, rank)
            torch.testing.assert_close(res[key], expected, rtol=0, atol=0, check_dtype=True,
                                       msg=lambda m: f"{key}, rank {rank}: {m}")
        for k, v in res.items():
            if k.startswith("metric_"):
                assert v == 0, (k, v)
        assert any(k.startswith("metric_") for k in res), sorted(res)
    print("native_kinds OK")


def case_native_mismatch() -> None:
    """Rank 0 calls all_reduce, rank 1 all_gather: both raise, within the timeout, an error
    naming both calls."""
    import torch
    import torch.distributed as dist

    from torch_pjrt.distributed import run_threads

    def fn(rank):
        _check_transport()
        x = torch.ones(4, device="tpu")
        start = time.monotonic()
        try:
            if rank == 0:
                dist.all_reduce(x)
            else:
                dist.all_gather_into_tensor(torch.empty(8, device="tpu"), x)
        except dist.DistBackendError as e:
            return str(e), time.monotonic() - start
        return "nothing raised", 0.0

    for rank, (msg, took) in enumerate(run_threads(fn, 2, timeout=20)):
        assert "rank 0 called all_reduce(float32[4], ReduceOp.SUM)" in msg, msg
        assert "rank 1 called all_gather_into_tensor(float32[4])" in msg, msg
        assert took < 10, took
    print("native_mismatch OK")


def case_native_refused() -> None:
    """TORCH_PJRT_DIST_TRANSPORT=native outside rank threads is refused at group creation."""
    import torch.distributed as dist

    os.environ["TORCH_PJRT_DIST_TRANSPORT"] = "native"
    with _raises(RuntimeError, "needs ranks that are threads of one process"):
        dist.init_process_group("tpu_dist", rank=0, world_size=1, store=dist.HashStore())
    print("native_refused OK")


def case_backward_thread() -> None:
    """A rank's backward runs on the rank's own thread (autograd multithreading is off there),
    where its c10d world is visible; the caller's setting is left as it was."""
    import threading

    import torch

    from torch_pjrt.distributed import run_threads

    before = torch._C._is_multithreading_enabled()

    def fn(rank):
        seen = []
        x = torch.ones(3, device="tpu", requires_grad=True)
        y = x * 2
        y.register_hook(lambda g: seen.append(threading.get_ident()) or g)
        y.sum().backward()
        return seen == [threading.get_ident()], x.grad.cpu().tolist()

    for same_thread, grad in run_threads(fn, 2):
        assert same_thread
        assert grad == [2.0, 2.0, 2.0]
    assert torch._C._is_multithreading_enabled() == before
    print("backward_thread OK")


def case_stalled_rank() -> None:
    """Issue 36 item 8: a rank that stalls (here: sleeps past the group's timeout before its
    all_reduce) makes the waiting rank raise within the timeout, never hang; the stalled rank's
    late collective raises too, and run_threads returns."""
    import torch
    import torch.distributed as dist

    from torch_pjrt.distributed import run_threads

    timeout = 3.0
    woke = {}

    def fn(rank):
        _check_transport()
        x = torch.ones(4, device="tpu")
        if rank == 1:
            time.sleep(3 * timeout)
            woke["late"] = True
        start = time.monotonic()
        try:
            dist.all_reduce(x)
        except Exception as e:  # noqa: BLE001 (the transports raise their own kinds)
            raise RuntimeError(f"rank {rank} after {time.monotonic() - start:.1f} s: {e}") from e
        return x.cpu()

    start = time.monotonic()
    with _raises(RuntimeError, "rank 0 after"):
        run_threads(fn, 2, timeout=timeout)
    took = time.monotonic() - start
    assert took < 6 * timeout, f"the caller waited {took:.1f} s"
    # rank 1's thread (asleep) was not killed: when it wakes its all_reduce must raise, not hang
    deadline = time.monotonic() + 6 * timeout
    while "late" not in woke and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "late" in woke
    print("stalled_rank OK")


def case_destroyed_group() -> None:
    """Issue 36 item 8: a collective issued on a group after it was destroyed raises, through
    c10d (the group is gone) and through the backend object kept from before."""
    import torch
    import torch.distributed as dist

    from torch_pjrt.distributed import run_threads

    def fn(rank):
        g = dist.new_group([0, 1])
        _check_transport(g)
        backend = g._get_backend(torch.device("tpu"))
        x = torch.ones(3, device="tpu")
        dist.all_reduce(x, group=g)
        dist.destroy_process_group(g)
        raised = []
        for call in (lambda: dist.all_reduce(x, group=g),
                     lambda: backend.allreduce([x]).wait()):
            try:
                call()
                raised.append(None)
            except Exception as e:  # noqa: BLE001
                raised.append(type(e).__name__)
        return x.cpu().tolist(), raised

    for values, raised in run_threads(fn, 2, timeout=20):
        assert values == [2.0, 2.0, 2.0]
        assert all(raised), raised
    print("destroyed_group OK")


# --- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("world", [2, 4])
def test_collectives(world, transport):
    # LOCAL_RANK names a process's device under torchrun; rank threads must ignore it.
    _run_case("collectives", str(world), env={"LOCAL_RANK": "1"} if world == 2 else {},
              transport=transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_failure_raises_names_rank_and_recovers(transport):
    _run_case("failure", transport=transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_ddp_gradients_match_cpu(transport):
    _run_case("ddp", transport=transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_fsdp2_gradients_match_cpu(transport):
    _run_case("fsdp2", transport=transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_pipelining_gpipe_matches_cpu(transport):
    _run_case("pipelining", transport=transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_dtensor_shard_replicate(transport):
    _run_case("dtensor", transport=transport)


@pytest.mark.parametrize("world", [2, 4])
def test_compiled_graphs_on_rank_threads(world):
    _run_case("compiled_ranks", str(world))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_fsdp2_compiled_blocks_gradients_match_cpu(transport):
    _run_case("fsdp2_compiled", transport=transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_tensor_parallel_compiled_gradients_match_cpu(transport):
    _run_case("tp_compiled", transport=transport)


def test_tensor_parallel_compiled_on_mesh_subgroups():
    """The "tp" dimension of a 2x2 mesh on 4 native rank threads: each sub-group's graphs are
    SPMD programs over its own two devices."""
    _run_case("tp_compiled", "4")


@pytest.mark.parametrize("world", [2, 4])
def test_native_every_collective(world):
    """Every c10d collective natively on `world` thread ranks against CPU, dtypes, the ReduceOp
    sweep, views, a sub-group, a 2x2 mesh (4 ranks), no host transfer."""
    _run_case("native_kinds", str(world))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_stalled_rank_raises_within_timeout(transport):
    _run_case("stalled_rank", transport=transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_collective_after_destroy_raises(transport):
    _run_case("destroyed_group", transport=transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_fsdp2_with_tensor_parallel_matches_cpu(transport):
    _run_case("fsdp2_tp", transport=transport)


def test_backward_runs_on_the_rank_thread():
    _run_case("backward_thread")


def test_native_mismatch_names_both_calls():
    _run_case("native_mismatch")


def test_spmd_graphs_that_differ_name_both_ranks():
    _run_case("spmd_mismatch")


def test_native_forced_without_threads_refused():
    _run_case("native_refused", transport="staged")


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
