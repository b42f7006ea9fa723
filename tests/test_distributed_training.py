"""PyTorch's own parallelism, unchanged, on the tpu device over tpu_dist (several processes).

DistributedDataParallel (several gradient buckets, ``no_sync`` accumulation with a comm hook,
``find_unused_parameters`` with a branch one rank skips and a parameter no rank uses), FSDP2
``fully_shard`` (reshard after forward on and off, a bf16 MixedPrecisionPolicy), DTensor
(distribute_tensor, Shard/Replicate/Partial, redistribute, ``parallelize_module`` tensor
parallel MLP), a 2-D DeviceMesh (FSDP2 over dp x TP over tp on 4 ranks), distributed
checkpointing (save on 2 ranks, load on 4 and on 1) and MPMD (ranks running different programs
between collectives).

Every reference is the same computation in one process on the CPU: training on the same global
batch from the same initial weights (float32: every step's loss rtol 1e-4, every parameter
after the last step rtol 1e-4 / atol 1e-5), the unsharded module, the original tensor. The
training runs must also make no CPU fallback on tpu.

How it runs: each test starts its ranks as fresh interpreters running this file as a script
(``python tests/test_distributed_training.py CASE RANK WORLD DIR``; the tpu device count is fixed
when the runtime starts, so it is set per job through TORCH_PJRT_CPU_DEVICE_COUNT). The ranks
meet through a FileStore in DIR, write their results to DIR/rank<R>.pt, and the test compares
them with the CPU reference it computes itself. Every job is bounded: ranks still running at
the job's deadline are killed and the test fails with their output (a hang fails, it never
blocks), and the process group's own timeout (60 s) turns a stuck collective into an error
before that. Several cases share one job to keep start-up and compile time down.
"""
from __future__ import annotations

import copy
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_pjrt.testing import titan

# ---------------------------------------------------------------------------------------------
# Shared by the ranks and the CPU references: models, data, the training recipe.
# ---------------------------------------------------------------------------------------------

BLOCK = 16      # sequence length of the tiny GPT
LOCAL_BATCH = 2  # sequences per rank per step
STEPS = 4
PG_TIMEOUT = datetime.timedelta(seconds=60)


def _dataset():
    from torch_pjrt import _models

    return _models.CharDataset(_models.zen_corpus(), BLOCK)


def _make_gpt(vocab: int, seed: int = 0) -> nn.Module:
    from torch_pjrt import _models

    torch.manual_seed(seed)
    return _models.TinyGPT(vocab, block=BLOCK, d=32, heads=2, layers=2)


def _global_batches(ds, n: int, world: int, seed: int = 1):
    """n global batches, each a list of `world` per-rank (x, y) shards (CPU tensors)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x, y = ds.batch(LOCAL_BATCH * world, g)
        rows = [slice(r * LOCAL_BATCH, (r + 1) * LOCAL_BATCH) for r in range(world)]
        out.append([(x[rs], y[rs]) for rs in rows])
    return out


class GPTWithBranch(nn.Module):
    """The tiny GPT plus a branch used only when asked (one rank skips it on some steps) and a
    parameter no forward ever uses: what ``find_unused_parameters=True`` is for."""

    def __init__(self, gpt: nn.Module, d: int = 32):
        super().__init__()
        self.gpt = gpt
        self.branch = nn.Linear(d, 1)
        self.never = nn.Linear(3, 3)

    def forward(self, x, y, use_branch: bool):
        loss = self.gpt(x, y)
        if use_branch:
            loss = loss + 0.1 * self.branch(self.gpt.tok(x)).pow(2).mean()
        return loss


def _uses_branch(rank: int, step: int) -> bool:
    return rank == 0 or step % 2 == 0  # rank 1 skips the branch on odd steps


def _mlp(seed: int = 0, d: int = 16, hidden: int = 32) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))


def _cpu_state(module: nn.Module) -> dict:
    """name -> full CPU copy of every parameter (DTensors gathered)."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in module.named_parameters():
        t = p.detach()
        if isinstance(t, DTensor):
            t = t.full_tensor()
        out[name] = t.cpu().clone()
    return out


# ---------------------------------------------------------------------------------------------
# The ranks (run when this file is executed as a script).
# ---------------------------------------------------------------------------------------------

def _fallbacks() -> tuple[int, dict]:
    return int(torch.tpu.metrics()["cpu_fallbacks"]), dict(torch.tpu.fallback_ops())


def _rank_ddp(rank: int, world: int, out: dict) -> None:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_pjrt.distributed as td

    dev = td.local_device()
    out["device"] = str(dev)
    out["current_device"] = torch.tpu.current_device()
    ds = _dataset()
    batches = _global_batches(ds, STEPS, world)
    f0 = _fallbacks()

    # 1. Gradient bucketing: a small bucket cap gives several buckets.
    model = _make_gpt(ds.vocab).to(dev)
    ddp = DDP(model, bucket_cap_mb=0.02)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in batches:
        x, y = step[rank]
        opt.zero_grad()
        loss = ddp(x.to(dev), y.to(dev))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out["bucket_losses"] = losses
    out["bucket_params"] = _cpu_state(ddp.module)
    out["num_buckets"] = len(ddp.reducer._get_zeros_like_grad_buckets())

    # 2. no_sync: two micro-batches per step, the first without communication; the gradients
    # go through a DDP comm hook (the reducer's futures).
    model = _make_gpt(ds.vocab).to(dev)
    ddp = DDP(model, bucket_cap_mb=0.02)
    ddp.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    micro = _global_batches(ds, 2 * STEPS, world, seed=2)
    losses = []
    for i in range(STEPS):
        opt.zero_grad()
        x, y = micro[2 * i][rank]
        with ddp.no_sync():
            loss0 = ddp(x.to(dev), y.to(dev))
            loss0.backward()
        # Gradients after the no_sync pass are this rank's own (nothing was reduced).
        if i == 0:
            out["local_grad_after_no_sync"] = model.head.weight.grad.cpu().clone()
        x, y = micro[2 * i + 1][rank]
        loss1 = ddp(x.to(dev), y.to(dev))
        loss1.backward()
        opt.step()
        losses.append((loss0.item(), loss1.item()))
    out["no_sync_losses"] = losses
    out["no_sync_params"] = _cpu_state(ddp.module)

    # 3. find_unused_parameters: rank 1 skips the branch on odd steps; `never` is never used.
    model = GPTWithBranch(_make_gpt(ds.vocab)).to(dev)
    ddp = DDP(model, find_unused_parameters=True, bucket_cap_mb=0.02)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for i, step in enumerate(batches):
        x, y = step[rank]
        opt.zero_grad()
        loss = ddp(x.to(dev), y.to(dev), _uses_branch(rank, i))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out["unused_losses"] = losses
    out["unused_params"] = _cpu_state(ddp.module)
    out["never_grad_is_none"] = model.never.weight.grad is None

    f1 = _fallbacks()
    out["fallbacks"] = f1[0] - f0[0]
    out["fallback_ops"] = {k: v - f0[1].get(k, 0) for k, v in f1[1].items() if v != f0[1].get(k, 0)}


def _shard_layout(model: nn.Module) -> list:
    from torch.distributed.tensor import DTensor

    return [(name, type(p).__name__, str(p.device),
             [str(pl) for pl in p.placements] if isinstance(p, DTensor) else None,
             list(p.to_local().shape) if isinstance(p, DTensor) else list(p.shape), list(p.shape))
            for name, p in model.named_parameters()]


def _rank_fsdp(rank: int, world: int, out: dict) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import DTensor

    import torch_pjrt.distributed as td

    dev = td.local_device()
    mesh = init_device_mesh("tpu", (world,))
    ds = _dataset()
    batches = _global_batches(ds, STEPS, world)
    f0 = _fallbacks()
    configs = {
        "fp32_reshard": dict(reshard=True, mp=MixedPrecisionPolicy()),
        "fp32_keep": dict(reshard=False, mp=MixedPrecisionPolicy()),
        "bf16": dict(reshard=True, mp=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                         reduce_dtype=torch.float32)),
    }
    assert set(configs) == set(FSDP_OPTIMIZERS)
    for name, cfg in configs.items():
        model = _make_gpt(ds.vocab)
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=cfg["reshard"], mp_policy=cfg["mp"])
        fully_shard(model, mesh=mesh, mp_policy=cfg["mp"])
        out[f"{name}_layout"] = _shard_layout(model)
        opt = FSDP_OPTIMIZERS[name](model.parameters())
        losses = []
        for i, step in enumerate(batches):
            x, y = step[rank]
            opt.zero_grad()
            loss = model(x.to(dev), y.to(dev))
            if i == 0:
                # Between forward and backward: a block resharded after forward holds its DTensor
                # shard again; one kept unsharded exposes the full tensor.
                w = model.blocks[0].mlp[0].weight
                out[f"{name}_after_forward"] = (type(w).__name__, list(
                    w.to_local().shape if isinstance(w, DTensor) else w.shape), str(w.dtype))
                out[f"{name}_loss_dtype"] = str(loss.dtype)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        out[f"{name}_losses"] = losses
        out[f"{name}_params"] = _cpu_state(model)
        out[f"{name}_param_dtype"] = str(next(model.parameters()).dtype)
    f1 = _fallbacks()
    out["fallbacks"] = f1[0] - f0[0]
    out["fallback_ops"] = {k: v - f0[1].get(k, 0) for k, v in f1[1].items() if v != f0[1].get(k, 0)}


# AdamW on the DTensor shards in float32, with eps=1e-3: Adam divides each gradient by its own
# magnitude, so with the default eps (1e-8) a gradient that is only rounding noise (the
# attention's key bias has a zero gradient in exact arithmetic) moves its weight by a full step
# in a random direction, and tpu's and CPU's rounding noise differ (8e-4 apart after 4 steps);
# eps=1e-3 leaves such gradients small and real ones (1e-3 and up) Adam-normalized. With bf16
# compute, SGD with momentum, for the same reason at bf16's larger noise.
FSDP_OPTIMIZERS = {
    "fp32_reshard": lambda params: torch.optim.AdamW(params, lr=1e-2, eps=1e-3),
    "fp32_keep": lambda params: torch.optim.AdamW(params, lr=1e-2, eps=1e-3),
    "bf16": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
}


def _close(a, b, what: str, problems: list, rtol=1.3e-6, atol=1e-5) -> None:
    try:
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)
    except AssertionError as e:
        problems.append(f"{what}: {str(e).splitlines()[0:4]}")


def _rank_dtensor_tp_mpmd(rank: int, world: int, out: dict) -> None:
    """Checked on the rank itself against CPU values every rank can compute."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    import torch_pjrt.distributed as td

    dev = td.local_device()
    mesh = init_device_mesh("tpu", (world,))
    problems = []
    f0 = _fallbacks()
    g = torch.Generator().manual_seed(5)
    full = torch.randn(7, 5, generator=g)  # 7 and 5 rows/cols: uneven shards on 2 ranks

    # distribute_tensor / full_tensor / redistribute among Shard(0), Shard(1), Replicate.
    placements = [Shard(0), Shard(1), Replicate()]

    def piece(t, placement):
        return t if isinstance(placement, Replicate) else torch.chunk(t, world, placement.dim)[rank]

    exact = dict(rtol=0, atol=0)
    for src in placements:
        d = distribute_tensor(full.to(dev), mesh, [src])
        local = d.to_local()
        if local.device != dev:
            problems.append(f"{src}: local shard on {local.device}, expected {dev}")
        _close(local.cpu(), piece(full, src), f"{src} local shard", problems, **exact)
        _close(d.full_tensor().cpu(), full, f"{src} full_tensor", problems, **exact)
        for dst in placements:
            r = d.redistribute(mesh, [dst])
            _close(r.to_local().cpu(), piece(full, dst), f"{src}->{dst} local", problems, **exact)
            _close(r.full_tensor().cpu(), full, f"{src}->{dst} full_tensor", problems, **exact)

    # Partial: each rank holds a summand; redistribute to Replicate (all_reduce) and to Shard
    # (reduce_scatter); avg as well.
    parts = [torch.randn(6, 4, generator=g) for _ in range(world)]
    total = sum(parts)
    p = DTensor.from_local(parts[rank].to(dev), mesh, [Partial()])
    _close(p.full_tensor().cpu(), total, "Partial full_tensor", problems)
    _close(p.redistribute(mesh, [Replicate()]).to_local().cpu(), total, "Partial->R", problems)
    _close(p.redistribute(mesh, [Shard(0)]).to_local().cpu(),
           torch.chunk(total, world, 0)[rank], "Partial->S(0)", problems)
    _close(p.redistribute(mesh, [Shard(1)]).to_local().cpu(),
           torch.chunk(total, world, 1)[rank], "Partial->S(1)", problems)
    pa = DTensor.from_local(parts[rank].to(dev), mesh, [Partial("avg")])
    _close(pa.full_tensor().cpu(), total / world, "Partial(avg) full_tensor", problems)

    # DTensor ops: S(1) @ S(0) is a Partial sum; the elementwise op on a Shard stays sharded.
    a, b = torch.randn(4, 6, generator=g), torch.randn(6, 3, generator=g)
    da = distribute_tensor(a.to(dev), mesh, [Shard(1)])
    db = distribute_tensor(b.to(dev), mesh, [Shard(0)])
    prod = da @ db
    out["matmul_placements"] = [str(x) for x in prod.placements]
    _close(prod.full_tensor().cpu(), a @ b, "S(1)@S(0)", problems)
    _close((F.gelu(da) * 2).full_tensor().cpu(), F.gelu(a) * 2, "elementwise on S(1)", problems)
    _close(da.sum().full_tensor().cpu(), a.sum(), "sum of S(1)", problems)

    # Tensor parallel MLP: Linear-GELU-Linear, column- then row-wise; forward, input grad and
    # every weight grad against the unsharded module on CPU.
    ref = _mlp()
    tp = copy.deepcopy(ref).to(dev)
    parallelize_module(tp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    out["tp_layout"] = _shard_layout(tp)
    x = torch.randn(5, 16, generator=g)
    xc = x.clone().requires_grad_()
    xt = x.to(dev).requires_grad_()
    yc, yt = ref(xc), tp(xt)
    w = torch.randn(5, 16, generator=g)
    (yc * w).sum().backward()
    (yt * w.to(dev)).sum().backward()
    _close(yt.cpu() if not isinstance(yt, DTensor) else yt.full_tensor().cpu(), yc.detach(),
           "TP forward", problems)
    _close(xt.grad.cpu(), xc.grad, "TP input grad", problems)
    for (name, pt), (_, pc) in zip(tp.named_parameters(), ref.named_parameters()):
        if pt.grad is None:
            problems.append(f"TP {name}: no grad")
            continue
        gt = pt.grad.full_tensor() if isinstance(pt.grad, DTensor) else pt.grad
        _close(gt.cpu(), pc.grad, f"TP grad {name}", problems)

    # MPMD: between collectives the ranks run different programs (different ops and shapes;
    # rank 0 in defer_and_fuse mode, which records its ops until the collective needs them).
    def contribution(r: int, k: int, device) -> torch.Tensor:
        gen = torch.Generator().manual_seed(100 * k + r)
        if r == 0:
            m = torch.randn(8, 8, generator=gen).to(device)
            v = torch.randn(8, 3, generator=gen).to(device)
            return torch.tanh(m @ m.T)[:, :3] * 2 + v.relu()
        m = torch.randn(8, 5, generator=gen).to(device)
        v = torch.randn(5, 3, generator=gen).to(device)
        return (m @ v).sigmoid().cumsum(0) - 1
    for k in range(3):
        with torch.tpu.eager_mode("defer_and_fuse" if rank == 0 else "strict"):
            t = contribution(rank, k, dev)
            if rank == 0 and k == 1:
                # rank 0 alone runs extra programs and a host read in between
                extra = torch.linalg.qr(torch.randn(6, 6, generator=g).to(dev)).Q.sum().item()
                out["extra"] = extra
            dist.all_reduce(t)
        expect = sum(contribution(r, k, "cpu") for r in range(world))
        _close(t.cpu(), expect, f"MPMD all_reduce {k}", problems, rtol=1e-5, atol=1e-5)
    # rank 1 computes, broadcasts; rank 0 receives into a tensor it never computed on.
    if rank == 1:
        t = contribution(1, 7, dev) * 3
    else:
        t = torch.empty(8, 3, device=dev)
    dist.broadcast(t, src=1)
    _close(t.cpu(), contribution(1, 7, "cpu") * 3, "MPMD broadcast from rank 1", problems,
           rtol=1e-5, atol=1e-5)
    # send/recv between different programs: rank 0 sends a reduction of its own, rank 1 adds
    # its own result before sending it back.
    if rank == 0:
        s = contribution(0, 9, dev).sum(0)
        dist.send(s, dst=1)
        back = torch.empty(3, device=dev)
        dist.recv(back, src=1)
        _close(back.cpu(), contribution(0, 9, "cpu").sum(0) + contribution(1, 9, "cpu").mean(0),
               "MPMD send/recv round trip", problems, rtol=1e-5, atol=1e-5)
    elif rank == 1:
        r = torch.empty(3, device=dev)
        dist.recv(r, src=0)
        dist.send(r + contribution(1, 9, dev).mean(0), dst=0)
    dist.barrier()
    f1 = _fallbacks()
    out["fallbacks"] = f1[0] - f0[0]
    out["fallback_ops"] = {k: v - f0[1].get(k, 0) for k, v in f1[1].items() if v != f0[1].get(k, 0)}
    out["problems"] = problems


def _rank_mesh2d(rank: int, world: int, out: dict) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    import torch_pjrt.distributed as td

    dev = td.local_device()
    mesh = init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp = mesh["dp"].get_local_rank()
    out["device"] = str(dev)
    out["coords"] = (dp, mesh["tp"].get_local_rank())
    f0 = _fallbacks()
    model = _mlp()
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    out["layout"] = _shard_layout(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    losses = []
    for x, y in _mlp_batches(2):
        xs, ys = x[dp * 4:(dp + 1) * 4], y[dp * 4:(dp + 1) * 4]
        opt.zero_grad()
        loss = F.mse_loss(model(xs.to(dev)), ys.to(dev))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out["losses"] = losses
    out["params"] = _cpu_state(model)
    f1 = _fallbacks()
    out["fallbacks"] = f1[0] - f0[0]


def _mlp_batches(dp_size: int, steps: int = STEPS):
    g = torch.Generator().manual_seed(3)
    target = _mlp(seed=9)
    out = []
    for _ in range(steps):
        x = torch.randn(4 * dp_size, 16, generator=g)
        with torch.no_grad():
            out.append((x, target(x)))
    return out


def _fsdp_gpt_with_optimizer(world: int, seed: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("tpu", (world,))
    ds = _dataset()
    model = _make_gpt(ds.vocab, seed=seed)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return ds, model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _full_state(model, opt) -> dict:
    """Model and optimizer state, gathered to full CPU tensors on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    flat = {f"model.{k}": v.detach().cpu().clone() for k, v in msd.items()}
    for fqn, st in osd["state"].items():
        for k, v in st.items():
            flat[f"optim.{fqn}.{k}"] = v.detach().cpu().clone() if torch.is_tensor(v) else v
    return flat


def _rank_dcp(rank: int, world: int, out: dict, job: dict) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import torch_pjrt.distributed as td

    dev = td.local_device()
    out["device"] = str(dev)
    ckpt = job["ckpt"]
    if job["mode"] == "save":
        ds, model, opt = _fsdp_gpt_with_optimizer(world, seed=0)
        for step in _global_batches(ds, 2, world):
            x, y = step[rank]
            opt.zero_grad()
            model(x.to(dev), y.to(dev)).backward()
            opt.step()
        msd, osd = get_state_dict(model, opt)
        out["saved_model_types"] = sorted({type(v).__name__ for v in msd.values()})
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt)
        out["state"] = _full_state(model, opt)
    else:
        # Another seed: loading must replace every value.
        ds, model, opt = _fsdp_gpt_with_optimizer(world, seed=123)
        x, y = _global_batches(ds, 1, world, seed=7)[0][rank]
        model(x.to(dev), y.to(dev)).backward()  # creates the optimizer state to load into
        opt.step()
        opt.zero_grad()
        out["before"] = _full_state(model, opt)
        msd, osd = get_state_dict(model, opt)
        sd = {"model": msd, "optim": osd}
        dcp.load(sd, checkpoint_id=ckpt)
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        out["local_shapes"] = {n: list(p.to_local().shape) for n, p in model.named_parameters()}
        out["state"] = _full_state(model, opt)
        # and it trains on from there
        x, y = _global_batches(ds, 1, world, seed=8)[0][rank]
        opt.zero_grad()
        loss = model(x.to(dev), y.to(dev))
        loss.backward()
        opt.step()
        out["next_loss"] = loss.item()


CASES = {
    "ddp": _rank_ddp,
    "fsdp": _rank_fsdp,
    "dtensor_tp_mpmd": _rank_dtensor_tp_mpmd,
    "mesh2d": _rank_mesh2d,
    "dcp": _rank_dcp,
}


def _rank_main(case: str, rank: int, world: int, workdir: str) -> None:
    import torch.distributed as dist

    import torch_pjrt  # noqa: F401  (autoload does this too; explicit for a plain checkout)

    job = json.load(open(os.path.join(workdir, "job.json")))
    dist.init_process_group(job.get("backend", "tpu_dist"),
                            init_method=f"file://{os.path.join(workdir, 'store')}",
                            rank=rank, world_size=world, timeout=PG_TIMEOUT)
    out = {"rank": rank}
    t0 = time.perf_counter()
    fn = CASES[case]
    if case == "dcp":
        fn(rank, world, out, job)
    else:
        fn(rank, world, out)
    out["seconds"] = time.perf_counter() - t0
    dist.destroy_process_group()
    torch.save(out, os.path.join(workdir, f"rank{rank}.pt"))


# ---------------------------------------------------------------------------------------------
# Launching jobs (the pytest side).
# ---------------------------------------------------------------------------------------------

def _launch(case: str, world: int, devices: int, timeout: float = 240, **job) -> list[dict]:
    """Runs `case` on `world` ranks (fresh interpreters, TORCH_PJRT_CPU_DEVICE_COUNT=devices)
    and returns each rank's results. Fails, with every rank's output, when a rank exits with an
    error or the job is still running after `timeout` seconds (its ranks are then killed)."""

    workdir = tempfile.mkdtemp(prefix=f"tpu_dist_{case}_")
    with open(os.path.join(workdir, "job.json"), "w") as f:
        json.dump(job, f)
    env = {**os.environ, "TORCH_PJRT_CPU_DEVICE_COUNT": str(devices),
           "TORCH_CPP_LOG_LEVEL": "ERROR", "PYTHONUNBUFFERED": "1"}
    env.pop("LOCAL_RANK", None)
    logs, procs = [], []
    for rank in range(world):
        log = open(os.path.join(workdir, f"rank{rank}.log"), "w+")
        logs.append(log)
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), case, str(rank), str(world), workdir],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=os.path.dirname(__file__)))
    deadline = time.monotonic() + timeout
    timed_out = False
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            break
    if timed_out:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()

    def output(r):
        logs[r].flush()
        logs[r].seek(0)
        return logs[r].read()[-5000:]

    report = "\n".join(f"--- rank {r} (rc {p.returncode}) ---\n{output(r)}"
                       for r, p in enumerate(procs))
    if timed_out:
        pytest.fail(f"{case}: ranks still running after {timeout:.0f} s (killed)\n{report}")
    if any(p.returncode != 0 for p in procs):
        pytest.fail(f"{case}: a rank failed\n{report}")
    results = [torch.load(os.path.join(workdir, f"rank{r}.pt"), weights_only=False)
               for r in range(world)]
    for log in logs:
        log.close()
    shutil.rmtree(workdir, ignore_errors=True)  # kept when the job failed
    return results


def _loss_problems(what: str, got, expect, rtol: float) -> list[str]:
    bad = []
    for i, (t, c) in enumerate(zip(got, expect)):
        if not abs(t - c) <= rtol * abs(c):
            bad.append(f"{what} step {i}: tpu {t:.7g} cpu {c:.7g} "
                       f"(rel {abs(t - c) / abs(c):.1e} > {rtol})")
    if len(got) != len(expect):
        bad.append(f"{what}: {len(got)} steps, expected {len(expect)}")
    return bad


def _param_problems(what: str, got: dict, expect: dict, rtol=1e-4, atol=1e-5) -> list[str]:
    bad = []
    if sorted(got) != sorted(expect):
        return [f"{what}: parameter names differ: {sorted(set(got) ^ set(expect))}"]
    for name in expect:
        try:
            torch.testing.assert_close(got[name].float(), expect[name].float(),
                                       rtol=rtol, atol=atol)
        except AssertionError as e:
            bad.append(f"{what} {name}: " + " ".join(str(e).split("\n")[1:4]))
    return bad


# CPU references: one process, the global batch, the same recipe.

def _cpu_ddp_reference(world: int) -> dict:
    ds = _dataset()
    batches = _global_batches(ds, STEPS, world)
    ref = {}

    model = _make_gpt(ds.vocab)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in batches:
        opt.zero_grad()
        per_rank = [model(x, y) for x, y in step]
        (sum(per_rank) / world).backward()  # DDP averages the ranks' gradients
        opt.step()
        losses.append([l.item() for l in per_rank])
    ref["bucket_losses"], ref["bucket_params"] = losses, _cpu_state(model)

    model = _make_gpt(ds.vocab)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    micro = _global_batches(ds, 2 * STEPS, world, seed=2)
    losses = []
    for i in range(STEPS):
        opt.zero_grad()
        l0 = [model(x, y) for x, y in micro[2 * i]]
        (sum(l0) / world).backward()
        l1 = [model(x, y) for x, y in micro[2 * i + 1]]
        (sum(l1) / world).backward()
        opt.step()
        losses.append([(a.item(), b.item()) for a, b in zip(l0, l1)])
    ref["no_sync_losses"], ref["no_sync_params"] = losses, _cpu_state(model)
    # each rank's own gradient of its first micro-batch (what no_sync must leave unreduced)
    model = _make_gpt(ds.vocab)
    ref["local_grad_after_no_sync"] = []
    for x, y in micro[0]:
        model.zero_grad()
        model(x, y).backward()
        ref["local_grad_after_no_sync"].append(model.head.weight.grad.clone())

    model = GPTWithBranch(_make_gpt(ds.vocab))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for i, step in enumerate(batches):
        opt.zero_grad()
        per_rank = [model(x, y, _uses_branch(r, i)) for r, (x, y) in enumerate(step)]
        (sum(per_rank) / world).backward()
        opt.step()
        losses.append([l.item() for l in per_rank])
    ref["unused_losses"], ref["unused_params"] = losses, _cpu_state(model)
    return ref


def _check_ddp(results: list[dict], devices: int) -> None:
    world = len(results)
    ref = _cpu_ddp_reference(world)
    problems = []
    for r, res in enumerate(results):
        expect_dev = f"tpu:{r}" if devices > 1 else "tpu:0"
        if res["device"] != expect_dev:
            problems.append(f"rank {r} used {res['device']}, expected {expect_dev}")
        if res["num_buckets"] < 3:
            problems.append(f"rank {r}: {res['num_buckets']} gradient buckets, expected several")
        problems += _loss_problems(f"rank {r} bucketing", res["bucket_losses"],
                                   [l[r] for l in ref["bucket_losses"]], 1e-4)
        problems += _loss_problems(f"rank {r} no_sync", [a for a, _ in res["no_sync_losses"]],
                                   [l[r][0] for l in ref["no_sync_losses"]], 1e-4)
        problems += _loss_problems(f"rank {r} no_sync synced",
                                   [b for _, b in res["no_sync_losses"]],
                                   [l[r][1] for l in ref["no_sync_losses"]], 1e-4)
        problems += _loss_problems(f"rank {r} unused", res["unused_losses"],
                                   [l[r] for l in ref["unused_losses"]], 1e-4)
        for key in ("bucket_params", "no_sync_params", "unused_params"):
            problems += _param_problems(f"rank {r} {key}", res[key], ref[key])
        problems += _param_problems(f"rank {r} no_sync local grad",
                                    {"head.weight": res["local_grad_after_no_sync"]},
                                    {"head.weight": ref["local_grad_after_no_sync"][r]})
        if not res["never_grad_is_none"]:
            problems.append(f"rank {r}: the never-used parameter got a gradient")
        if res["fallbacks"]:
            problems.append(f"rank {r}: {res['fallbacks']} CPU fallbacks: {res['fallback_ops']}")
    # the local gradients of the ranks differ (else no_sync would prove nothing)
    assert not torch.allclose(*ref["local_grad_after_no_sync"][:2])
    # rank 1's branch parameter moved less than if it had been used everywhere: the reference
    # must learn (else the loss comparisons prove nothing)
    assert ref["bucket_losses"][-1][0] < ref["bucket_losses"][0][0]
    print("ddp seconds per rank:", [round(res["seconds"], 1) for res in results])
    assert not problems, "\n".join(problems)


@pytest.mark.long
def test_ddp_tiny_gpt_one_device_per_rank():
    """DDP on tpu:0 and tpu:1 (TORCH_PJRT_CPU_DEVICE_COUNT=2)."""
    _check_ddp(_launch("ddp", world=2, devices=2), devices=2)


# long (28 s, the slowest of CI's suite; `scripts/test.sh --long` runs it): CI's
# 20-minute budget
@pytest.mark.long
def test_ddp_tiny_gpt_ranks_share_one_device():
    """DDP with both ranks on tpu:0, each in its own process."""
    _check_ddp(_launch("ddp", world=2, devices=1), devices=1)


def _cpu_fsdp_reference(world: int, name: str) -> dict:
    """Single-process CPU training on the global batch. With bf16, FSDP2's policy by hand: the
    float32 master weights are cast to bfloat16 for forward and backward, each rank's bf16
    gradient is cast to float32 and averaged (reduce_dtype), and AdamW updates the float32
    weights."""
    bf16 = name == "bf16"
    ds = _dataset()
    batches = _global_batches(ds, STEPS, world)
    model = _make_gpt(ds.vocab)
    opt = FSDP_OPTIMIZERS[name](model.parameters())
    losses = []
    for step in batches:
        opt.zero_grad()
        if not bf16:
            per_rank = [model(x, y) for x, y in step]
            (sum(per_rank) / world).backward()
            losses.append([l.item() for l in per_rank])
        else:
            low = copy.deepcopy(model).to(torch.bfloat16)
            grads = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
            row = []
            for x, y in step:
                low.zero_grad()
                loss = low(x, y)
                loss.backward()
                row.append(loss.item())
                for n, p in low.named_parameters():
                    grads[n] += p.grad.float() / world
            for n, p in model.named_parameters():
                p.grad = grads[n]
            losses.append(row)
        opt.step()
    return {"losses": losses, "params": _cpu_state(model)}


# bf16 tolerance: tpu and CPU both round every op's result to bfloat16 (8 significant bits,
# a relative step of 2^-8 = 3.9e-3), but not always at the same points (XLA's CPU compiler and
# PyTorch's CPU kernels accumulate matmuls and reductions differently), so a loss may differ
# by a bf16 step (seen: 4.1e-3, exactly one step, at 2 of 8 rank-steps; the others equal): rtol
# 1e-2 for losses. The float32 master parameters after 4 SGD steps: rtol 1e-2 / atol 1e-3
# (seen: 1.7e-4 at most).
BF16_LOSS_RTOL = 1e-2
BF16_PARAM_TOL = dict(rtol=1e-2, atol=1e-3)


def test_fsdp2_tiny_gpt():
    from torch.distributed.tensor import Shard

    results = _launch("fsdp", world=2, devices=2)
    world = len(results)
    refs = {name: _cpu_fsdp_reference(world, name) for name in FSDP_OPTIMIZERS}
    shard0 = [str(Shard(0))]
    problems = []
    for r, res in enumerate(results):
        for name, rtol, ptol in (("fp32_reshard", 1e-4, {}), ("fp32_keep", 1e-4, {}),
                                 ("bf16", BF16_LOSS_RTOL, BF16_PARAM_TOL)):
            ref = refs[name]
            # sharded parameters: DTensors on this rank's device, Shard(0), dim 0 split in two
            for pname, typ, dev, placements, local, shape in res[f"{name}_layout"]:
                want = (shape[0] + world - 1) // world
                want_local = [min(want, max(0, shape[0] - r * want))] + shape[1:]
                if (typ, dev, placements, local) != ("DTensor", f"tpu:{r}", shard0, want_local):
                    problems.append(f"rank {r} {name} {pname}: {typ} on {dev} {placements} local "
                                    f"{local} (expected a DTensor on tpu:{r} {shard0} "
                                    f"{want_local})")
            typ, shape, dtype = res[f"{name}_after_forward"]
            if name == "fp32_keep":
                if typ != "Parameter" and typ != "Tensor" or shape != [128, 32]:
                    problems.append(f"rank {r} {name}: after forward the block weight is {typ} "
                                    f"{shape}, expected the unsharded [128, 32]")
            elif typ != "DTensor" or shape != [64, 32]:
                problems.append(f"rank {r} {name}: after forward the block weight is {typ} "
                                f"{shape}, expected its [64, 32] shard (resharded)")
            want_dtype = "torch.bfloat16" if name == "bf16" else "torch.float32"
            if res[f"{name}_loss_dtype"] != want_dtype:
                problems.append(f"rank {r} {name}: loss dtype {res[f'{name}_loss_dtype']}")
            if res[f"{name}_param_dtype"] != "torch.float32":
                problems.append(f"rank {r} {name}: sharded parameters are "
                                f"{res[f'{name}_param_dtype']}")
            problems += _loss_problems(f"rank {r} {name}", res[f"{name}_losses"],
                                       [l[r] for l in ref["losses"]], rtol)
            problems += _param_problems(f"rank {r} {name}", res[f"{name}_params"], ref["params"],
                                        **ptol)
        if res["fallbacks"]:
            problems.append(f"rank {r}: {res['fallbacks']} CPU fallbacks: {res['fallback_ops']}")
    # the bf16 reference is not the fp32 one (else the bf16 check would not test the policy)
    assert refs["fp32_reshard"]["losses"][0] != refs["bf16"]["losses"][0]
    print("fsdp seconds per rank:", [round(res["seconds"], 1) for res in results])
    assert not problems, "\n".join(problems)


def test_dtensor_tensor_parallel_and_mpmd():
    from torch.distributed.tensor import Partial, Replicate, Shard

    results = _launch("dtensor_tp_mpmd", world=2, devices=2)
    problems = [f"rank {res['rank']}: {p}" for res in results for p in res["problems"]]
    for r, res in enumerate(results):
        layout = {name: (typ, dev, pl) for name, typ, dev, pl, *_ in res["tp_layout"]}
        want = {"0.weight": [str(Shard(0))], "0.bias": [str(Shard(0))],
                "2.weight": [str(Shard(1))], "2.bias": [str(Replicate())]}
        for name, pl in want.items():
            if layout[name] != ("DTensor", f"tpu:{r}", pl):
                problems.append(f"rank {r} TP {name}: {layout[name]}, "
                                f"expected DTensor on tpu:{r} {pl}")
        if res["matmul_placements"] != [str(Partial())]:
            problems.append(f"rank {r}: S(1)@S(0) placements {res['matmul_placements']}")
        if res["fallbacks"]:
            problems.append(f"rank {r}: {res['fallbacks']} CPU fallbacks: {res['fallback_ops']}")
    print("dtensor seconds per rank:", [round(res["seconds"], 1) for res in results])
    assert not problems, "\n".join(problems)


def test_2d_mesh_fsdp_dp_tp_4_ranks():
    results = _launch("mesh2d", world=4, devices=4, timeout=300)
    # CPU: the dp groups see the two halves of the global batch (the tp ranks of a group the
    # same half); their gradients are averaged.
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    losses = []
    for x, y in _mlp_batches(2):
        opt.zero_grad()
        per_dp = [F.mse_loss(model(x[d * 4:(d + 1) * 4]), y[d * 4:(d + 1) * 4]) for d in range(2)]
        (sum(per_dp) / 2).backward()
        opt.step()
        losses.append([l.item() for l in per_dp])
    params = _cpu_state(model)
    assert losses[-1][0] < losses[0][0], "the CPU reference does not learn"
    problems = []
    for r, res in enumerate(results):
        dp, tp = res["coords"]
        if res["device"] != f"tpu:{r}" or (dp, tp) != (r // 2, r % 2):
            problems.append(f"rank {r}: device {res['device']}, mesh coordinates {(dp, tp)}")
        for name, typ, dev, placements, local, shape in res["layout"]:
            if typ != "DTensor" or len(placements) != 2:
                problems.append(f"rank {r} {name}: {typ} {placements}, expected a 2-D DTensor")
        problems += _loss_problems(f"rank {r}", res["losses"], [l[dp] for l in losses], 1e-4)
        problems += _param_problems(f"rank {r}", res["params"], params)
        if res["fallbacks"]:
            problems.append(f"rank {r}: {res['fallbacks']} CPU fallbacks")
    print("mesh2d seconds per rank:", [round(res["seconds"], 1) for res in results])
    assert not problems, "\n".join(problems)


@pytest.mark.long  # 39 s (seven process launches); CI keeps its budget
def test_dcp_save_2_ranks_load_4_and_1():
    ckpt = tempfile.mkdtemp(prefix="tpu_dist_dcp_")
    saved = _launch("dcp", world=2, devices=2, mode="save", ckpt=ckpt)
    problems = []
    ref = saved[0]["state"]
    for key, v in saved[1]["state"].items():  # every rank gathers the same full state
        if torch.is_tensor(v) and not torch.equal(v, ref[key]):
            problems.append(f"save: ranks disagree on {key}")
    if saved[0]["saved_model_types"] != ["DTensor"]:
        problems.append(f"save: the model state dict holds {saved[0]['saved_model_types']}")
    n_optim = sum(k.startswith("optim.") and k.endswith("exp_avg") for k in ref)
    n_model = sum(k.startswith("model.") for k in ref)
    if n_optim != n_model or n_model == 0:
        problems.append(f"save: {n_model} model tensors, {n_optim} exp_avg tensors")
    for world, devices in ((4, 4), (1, 1)):
        loaded = _launch("dcp", world=world, devices=devices, mode="load", ckpt=ckpt)
        for r, res in enumerate(loaded):
            got = res["state"]
            if sorted(got) != sorted(ref):
                problems.append(f"load on {world}, rank {r}: keys differ "
                                f"{sorted(set(got) ^ set(ref))}")
                continue
            changed = [k for k in ref
                       if torch.is_tensor(ref[k]) and not torch.equal(res["before"][k], ref[k])]
            if len(changed) < n_model:
                problems.append(f"load on {world}: the fresh model already matched the checkpoint")
            for k, v in ref.items():
                same = torch.equal(got[k], v) if torch.is_tensor(v) else got[k] == v
                if not same:
                    problems.append(f"load on {world}, rank {r}: {k} differs from what was saved")
            if world == 4:
                # resharded: dim 0 in four pieces (the position table's BLOCK rows)
                if res["local_shapes"]["pos.weight"] != [BLOCK // 4, 32]:
                    problems.append(f"load on 4, rank {r}: pos.weight shard "
                                    f"{res['local_shapes']['pos.weight']}")
            if not res["next_loss"] == res["next_loss"]:
                problems.append(f"load on {world}, rank {r}: NaN loss after loading")
    shutil.rmtree(ckpt, ignore_errors=True)
    assert not problems, "\n".join(problems[:40])


# ---------------------------------------------------------------------------------------------
# TorchTitan (the torchtitan package from PyPI, 0.3.0): its own train entry point, its llama3
# debug model config, FSDP2 over 2 processes launched by torchrun, on tpu.
# ---------------------------------------------------------------------------------------------

# Where torchtitan and its dependencies are installed when not in the venv (a pip --target
# folder; docs/distributed.md has the commands). torch itself always comes from the venv.
TITAN_PATH = os.environ.get("TORCH_PJRT_TORCHTITAN_PATH", "")
TITAN_STEPS = 10


def _titan_main(args: list[str]) -> None:
    """Runs torchtitan.train (as torchrun's per-rank script) with one substitution for what
    torch 2.13 lacks; everything else (the trainer, the llama3 model with its compiled
    FlexAttention, its FSDP2 parallelization with bf16 params, selective activation
    checkpointing, AdamW, the dataloader, the loss) is torchtitan's own code, unchanged.

    torch.distributed.set_timeout, which torchtitan calls after the first step, is newer than
    torch 2.13: ProcessGroup.set_timeout (every backend of the group) stands in.
    """
    import runpy

    def set_timeout(timeout, group=None):
        import torch.distributed as dist

        if group is None:
            group = dist.distributed_c10d._get_default_group()
        group.set_timeout(timeout)

    if not hasattr(torch.distributed, "set_timeout"):
        torch.distributed.set_timeout = set_timeout
    sys.argv = ["torchtitan.train", *args]
    runpy.run_module("torchtitan.train", run_name="__main__")


def _titan_env() -> dict:
    env = {**os.environ, "TORCH_PJRT_CPU_DEVICE_COUNT": "2", "PYTHONUNBUFFERED": "1",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    if TITAN_PATH:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (TITAN_PATH, env.get("PYTHONPATH")) if p)
    return env


@pytest.mark.long
@pytest.mark.parametrize("compiled", [False, True])
def test_torchtitan_llama3_debugmodel_fsdp2_2_ranks(compiled):
    """torchtitan's own entry point and llama3 debug config with FSDP2 on 2 ranks, eager and
    with `--compile.enable`. On torch 2.14.1 nothing is substituted: `python -m
    torchtitan.train` with its default options (the spmd_types FSDP backend). On 2.13, the
    `titan` entry of this file (`_titan_main`: a stand-in for torch.distributed.set_timeout)
    and the partial_dtensor backend (2.13's fully_shard refuses spmd_types' plain
    parameters). About 20 s with a warm compile cache, 50-100 s cold."""
    import re
    import signal

    probe = subprocess.run([sys.executable, "-c", "import torchtitan.train, torchtitan; "
                            "print(torchtitan.__version__)"],
                           capture_output=True, text=True, env=_titan_env(), timeout=120)
    if probe.returncode != 0:
        pytest.skip("torchtitan is not installed (docs/distributed.md, TorchTitan): "
                    + (probe.stderr.strip().splitlines() or ["?"])[-1])
    folder = tempfile.mkdtemp(prefix="tpu_dist_titan_")
    data_dir, tok_dir = titan.make_assets(folder)
    env = {**_titan_env(), "HF_DATASETS_CACHE": os.path.join(folder, "hf_cache")}
    unchanged = hasattr(torch.distributed, "set_timeout")  # torch 2.14 and later
    entry = (["-m", "torchtitan.train"] if unchanged else
             [os.path.abspath(__file__), "titan", "--parallelism.spmd-backend", "partial_dtensor"])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           *entry,
           "--module", "llama3", "--config", "llama3_debugmodel",
           "--hf-assets-path", tok_dir, "--dataloader.dataset-path", data_dir,
           "--training.steps", str(TITAN_STEPS), "--training.seq-len", "256",
           "--training.local-batch-size", "2", "--parallelism.data-parallel-shard-degree", "2",
           *(["--compile.enable"] if compiled else []),
           "--checkpoint.no-enable", "--validator.no-enable", "--debug.seed", "0",
           "--metrics.disable-color-printing", "--dump-folder", os.path.join(folder, "out")]
    log_path = os.path.join(folder, "titan.log")
    with open(log_path, "w+") as log:
        # its own session, so that a hang is ended with torchrun and both ranks
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=folder,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=240)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
        log.seek(0)
        output = log.read()
    if rc != 0:
        what = "timed out" if rc is None else f"exited {rc}"
        pytest.fail(f"torchtitan run {what}:\n{output[-8000:]}")
    rank0 = [line for line in output.splitlines() if not line.startswith("[rank1]")]
    losses = {}
    for line in rank0:
        m = re.search(r"step:\s+(\d+)\s+loss:\s+([0-9.]+)", line)
        if m:
            losses.setdefault(int(m.group(1)), float(m.group(2)))
    print("torchtitan losses:", losses)
    assert sorted(losses) == list(range(1, TITAN_STEPS + 1)), output[-4000:]
    # the FSDP mesh axis: 'fsdp' (partial_dtensor) or 'dp_shard' (spmd_types)
    assert "Applied FSDP to the model" in output and ("'fsdp'" in output or "'dp_shard'" in output), \
        "no FSDP in torchtitan's log"
    first, last = losses[1], losses[TITAN_STEPS]
    # from about ln(2048) = 7.6 at initialization; falling by more than 1.5 nats in 10 steps
    # (seen: 8.18 -> 5.91)
    assert 6.5 < first < 9 and last < first - 1.5, losses
    shutil.rmtree(folder, ignore_errors=True)


def _require_unchanged_torchtitan() -> None:
    """Skips where torchtitan cannot run unchanged: torch before 2.14 (no
    torch.distributed.set_timeout) or torchtitan not installed."""
    if not hasattr(torch.distributed, "set_timeout"):
        pytest.skip("torchtitan 0.3.0 unchanged needs torch.distributed.set_timeout (torch 2.14)")
    probe = subprocess.run([sys.executable, "-c", "import torchtitan.train"], capture_output=True,
                           text=True, env=_titan_env(), timeout=120)
    if probe.returncode != 0:
        pytest.skip("torchtitan is not installed (docs/distributed.md, TorchTitan)")


@pytest.mark.long
@pytest.mark.parametrize("cell", ["llama3 FSDP2 compile", "llama3 TP2", "flux 1 rank"])
def test_torchtitan_parity_with_cpu_gloo(cell):
    """torchtitan.train unchanged on tpu (2 ranks; flux 1, 8 steps) against the same config on
    CPU tensors with Gloo (torch_pjrt/testing/titan_cpu.py), both from one CPU-made seed
    checkpoint: 20 steps' losses to rtol 1e-4 at step 1 and 1e-2 after, step 1's gradient
    norm, no CPU fallback on any rank (torch_pjrt/testing/titan.py, run_cell). torch 2.14.1:
    torchtitan 0.3.0 calls torch.distributed.set_timeout, which 2.13 lacks (the 2.13 run above
    substitutes it)."""
    _require_unchanged_torchtitan()
    work = tempfile.mkdtemp(prefix="tpu_titan_parity_")
    try:
        assets = titan.make_assets(os.path.join(work, "assets"))
        spec = next(c for c in titan.CELLS if c.name == cell)
        record = titan.run_cell(spec, work, assets, steps=20, timeout=900)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({k: record[k] for k in ("status", "cause", "fallback_ops")}))
    assert record["status"] == "pass", record
    steps = spec.steps or 20  # flux: 8 (titan.CELLS)
    assert len(record["tpu"]["losses"]) == steps and record["tpu"]["losses"][-1] < 6


def test_flux_stand_in_assets_load(tmp_path):
    """The stand-ins for FLUX's hub and source-tree assets (torch_pjrt/testing/titan_flux.py)
    load through the classes torchtitan's flux recipe uses (T5Tokenizer, CLIPTokenizer,
    T5EncoderModel, CLIPTextModel, from a local path) with the widths flux-debug takes (T5 4096,
    CLIP's pooled 768), and the images are a WebDataset tar of 256 x 256 JPEGs with captions.
    Cheap: no torchtitan, no training (the training run is the "flux FSDP2" matrix cell)."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("PIL")
    transformers = pytest.importorskip("transformers")
    import io
    import tarfile

    from PIL import Image

    from torch_pjrt.testing import titan_flux

    paths = titan_flux.make_flux_assets(str(tmp_path), autoencoder=False)
    caption = "A small red circle at the top left, on a blue background."
    t5_tok = transformers.T5Tokenizer.from_pretrained(paths["t5"], max_length=256)
    clip_tok = transformers.CLIPTokenizer.from_pretrained(paths["clip"], max_length=77)
    t5_ids = t5_tok(caption, padding="max_length", max_length=256, truncation=True,
                    return_tensors="pt")["input_ids"]
    clip_ids = clip_tok(caption, padding="max_length", max_length=77, truncation=True,
                        return_tensors="pt")["input_ids"]
    first = t5_tok.convert_ids_to_tokens(t5_ids[0, :3].tolist())
    assert first == ["\u2581A", "\u2581small", "\u2581red"], first
    assert t5_tok.unk_token_id not in t5_ids.tolist()[0]
    decoded = clip_tok.decode(clip_ids[0], skip_special_tokens=True)  # "left ," : word ends
    assert decoded.replace(" ", "") == caption.lower().replace(" ", "")
    with torch.no_grad():
        t5 = transformers.T5EncoderModel.from_pretrained(paths["t5"]).eval()
        clip = transformers.CLIPTextModel.from_pretrained(paths["clip"]).eval()
        assert t5(input_ids=t5_ids).last_hidden_state.shape == (1, 256, 4096)
        pooled = clip(input_ids=clip_ids).pooler_output
    assert pooled.shape == (1, 768) and torch.isfinite(pooled).all()
    with tarfile.open(os.path.join(paths["data"], "shard-000000.tar")) as tar:
        names = tar.getnames()
        assert len(names) == 2 * titan_flux.IMAGES
        img = Image.open(io.BytesIO(tar.extractfile("000000.jpg").read()))
        text = tar.extractfile("000000.txt").read().decode()
    assert img.size == (256, 256) and img.mode == "RGB" and text.endswith("background.")


@pytest.mark.long
def test_torchtitan_dcp_kill_resume_bit_identical():
    """torchtitan.train on tpu (FSDP2, 2 ranks, compiled) with DCP checkpoints: a run killed
    (SIGKILL, every rank) after its step-10 save and resumed gives steps 11..20 and final
    weights bit-identical to an uninterrupted run (torch_pjrt/testing/titan_resume.py)."""
    _require_unchanged_torchtitan()
    from torch_pjrt.testing import titan_resume

    work = tempfile.mkdtemp(prefix="tpu_titan_resume_")
    try:
        record = titan_resume.check_resume(
            work, args=("--parallelism.data-parallel-shard-degree", "2", "--compile.enable"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert record["ok"], record.get("problems")


if __name__ == "__main__":
    if sys.argv[1] == "titan":
        _titan_main(sys.argv[2:])
        sys.exit(0)
    try:
        _rank_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)  # never wait for peers or threads of a failed rank


def test_titan_only_selects_an_exact_name_alone_else_by_substring():
    names = [c.name for c in titan.CELLS]
    exact = "qwen3 MoE FSDP2+EP2"
    assert exact in names and exact + " compile" in names
    assert [n for n in names if titan._selected(n, [exact], names)] == [exact]
    # a fragment still selects every name containing it
    assert {n for n in names if titan._selected(n, ["EP2"], names)} == \
        {n for n in names if "EP2" in n}
