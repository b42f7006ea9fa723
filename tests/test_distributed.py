"""Multi-process tests of tpu_dist, the torch.distributed backend of the tpu device
(torch_pjrt/distributed, csrc/bridge/distributed.cpp).

Each test runs a job of 2 ranks: worker processes running this file (``python
tests/test_distributed.py <job> <rank> <world> <init_method> <result_dir>``), started with
subprocess, torchrun or torch.multiprocessing.spawn. Every job is bounded by a timeout, so a
hang fails the test instead of blocking CI. The big job runs every collective on tpu tensors
and the same collective on CPU tensors over Gloo in one process group ("cpu:gloo,tpu:tpu_dist")
and compares values, dtypes, shapes and the caller's tensors after the call (in-place results,
views, untouched inputs) exactly. Where Gloo itself cannot serve as the reference (int16, which
Gloo lacks; PREMUL_SUM, which it refuses; non-contiguous tensors, which Gloo's allreduce reads
as if contiguous and its all_to_all refuses), the reference is Gloo on CPU tensors prepared to
what the result must be (int32 values, pre-scaled inputs, contiguous copies written back).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import zlib

import pytest

HERE = os.path.abspath(__file__)
WORLD = 2


# =============================================================================================
# The pytest side: launchers and assertions.
# =============================================================================================


def _env(extra=None):
    env = dict(os.environ)
    # Workers import torch_pjrt from this checkout even when it is not installed.
    root = os.path.dirname(os.path.dirname(HERE))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TORCH_PJRT_CACHE_DIR", tempfile.mkdtemp(prefix="torch_pjrt_dist_cache_"))
    env.pop("LOCAL_RANK", None)
    env.update(extra or {})
    return env


def _collect(procs, timeout, what):
    """Waits for every process; kills them all and fails if any is still running after
    `timeout` seconds. Returns their outputs."""
    deadline = time.monotonic() + timeout
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            rest = [q.communicate()[0] for q in procs]
            raise AssertionError(f"{what} did not finish within {timeout} s (a hang); output:\n"
                                 + "\n----\n".join(o[-3000:] for o in rest))
        outs.append(out)
    return outs


def _results(d, world):
    res = []
    for r in range(world):
        path = os.path.join(d, f"rank{r}.json")
        res.append(json.load(open(path)) if os.path.exists(path) else None)
    return res


def run_job(job, timeout, world=WORLD, env=None):
    """Runs `job` on `world` worker processes started with subprocess (FileStore rendezvous)."""
    with tempfile.TemporaryDirectory(prefix="tpu_dist_test_") as d:
        init = "file://" + os.path.join(d, "store")
        procs = [subprocess.Popen([sys.executable, HERE, job, str(r), str(world), init, d],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env=_env(env))
                 for r in range(world)]
        outs = _collect(procs, timeout, f"job {job}")
        return [p.returncode for p in procs], outs, _results(d, world)


def run_torchrun(job, timeout, world=WORLD, env=None):
    """Runs `job` under torchrun (env:// rendezvous, RANK/LOCAL_RANK/WORLD_SIZE from it)."""
    with tempfile.TemporaryDirectory(prefix="tpu_dist_test_") as d:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={world}", HERE, job, "env", str(world), "env://", d]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=_env(env))
        (out,) = _collect([p], timeout, f"torchrun job {job}")
        return p.returncode, out, _results(d, world)


def run_spawn(job, timeout, world=WORLD, env=None):
    """Runs `job` with torch.multiprocessing.spawn from one launcher process."""
    with tempfile.TemporaryDirectory(prefix="tpu_dist_test_") as d:
        init = "file://" + os.path.join(d, "store")
        p = subprocess.Popen([sys.executable, HERE, "spawn:" + job, "0", str(world), init, d],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=_env(env))
        (out,) = _collect([p], timeout, f"spawned job {job}")
        return p.returncode, out, _results(d, world)


def _assert_ok(rcs, outs, results):
    for r, (rc, out, res) in enumerate(zip(rcs, outs, results)):
        assert rc == 0 and res is not None, f"rank {r} exited with {rc}; output:\n{out[-4000:]}"


def test_collectives_match_gloo_on_cpu():
    rcs, outs, results = run_job("collectives", timeout=120)
    _assert_ok(rcs, outs, results)
    for r, res in enumerate(results):
        assert res["failures"] == [], f"rank {r}:\n" + "\n".join(res["failures"])
        assert res["checks"] > 150, res["checks"]  # the job really compared its cases
        assert res["fallbacks"] == 0, f"rank {r}: CPU fallbacks {res['fallback_ops']}"
        assert res["uploads"] > 0 and res["zero_copy_uploads"] <= res["uploads"]


@pytest.mark.parametrize("devices", [1, 2])
def test_init_default_backend_under_torchrun(devices):
    """With one device both ranks use tpu:0; with two (TORCH_PJRT_CPU_DEVICE_COUNT=2) each
    rank uses tpu:<local rank>."""
    rc, out, results = run_torchrun("default", timeout=90,
                                    env={"TORCH_PJRT_CPU_DEVICE_COUNT": str(devices)})
    assert rc == 0, out[-4000:]
    for r, res in enumerate(results):
        assert res is not None, out[-4000:]
        assert res["failures"] == [], f"rank {r}:\n" + "\n".join(res["failures"])


def test_mismatched_collectives_raise():
    rcs, outs, results = run_job("mismatch", timeout=90)
    _assert_ok(rcs, outs, results)
    for r, res in enumerate(results):
        assert res["failures"] == [], f"rank {r}:\n" + "\n".join(res["failures"])


def test_collectives_on_inference_tensors():
    rcs, outs, results = run_job("inference", timeout=90)
    _assert_ok(rcs, outs, results)
    for r, res in enumerate(results):
        assert res["failures"] == [], f"rank {r}:\n" + "\n".join(res["failures"])
        assert res["checks"] == 81, res["checks"]


def test_dead_rank_raises_under_spawn():
    rc, out, results = run_spawn("dead", timeout=90)
    assert rc == 0, out[-4000:]
    res = results[0]
    assert res is not None, out[-4000:]
    assert res["failures"] == [], "\n".join(res["failures"])


# =============================================================================================
# The worker side. Everything below runs in the rank processes.
# =============================================================================================


class Checker:
    """Collects failures instead of stopping at the first one, so one run reports them all."""

    def __init__(self):
        self.failures = []
        self.checks = 0

    def fail(self, name, msg):
        self.failures.append(f"{name}: {msg}")

    def true(self, name, cond, msg=""):
        self.checks += 1
        if not cond:
            self.fail(name, msg or "condition false")

    def same(self, name, got, want):
        """`got` (tpu results) equals `want` (CPU results): same structure, tensors of the same
        dtype and shape, equal values, tpu tensors on tpu."""
        import torch
        from torch.utils._pytree import tree_leaves

        self.checks += 1
        g, w = tree_leaves(got), tree_leaves(want)
        if len(g) != len(w):
            return self.fail(name, f"{len(g)} results, expected {len(w)}")
        for i, (a, b) in enumerate(zip(g, w)):
            if isinstance(b, torch.Tensor):
                if not isinstance(a, torch.Tensor):
                    return self.fail(name, f"result {i} is {type(a).__name__}, not a tensor")
                if b.device.type == "cpu" and a.device.type != "tpu":
                    return self.fail(name, f"result {i} is on {a.device}, expected tpu")
                if a.dtype != b.dtype or a.shape != b.shape:
                    return self.fail(name, f"result {i}: {a.dtype}{list(a.shape)}, expected "
                                           f"{b.dtype}{list(b.shape)}")
                a = a.cpu()
                if not torch.equal(a, b):
                    return self.fail(name, f"result {i} differs: got {a.flatten()[:8].tolist()} "
                                           f"expected {b.flatten()[:8].tolist()}")
            elif a != b:
                return self.fail(name, f"result {i}: {a!r}, expected {b!r}")


def values(case, shape, dtype, rank):
    """Deterministic values per (case, rank), the same on every device they are moved to."""
    import torch

    g = torch.Generator().manual_seed(zlib.crc32(case.encode()) * 8 + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point or dtype.is_complex:
        x = torch.randn(shape, generator=g, dtype=torch.complex64 if dtype.is_complex else None)
        return (x * 4).round().to(dtype) / 4 if not dtype.is_complex else x.to(dtype)
    lo, hi = (0, 60) if dtype == torch.uint8 else (-60, 60)
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def _init(rank, world, init, backend, timeout_s=60):
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))


def job_collectives(rank, world, init):
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    import torch_pjrt.distributed as td

    _init(rank, world, init, "cpu:gloo,tpu:tpu_dist")
    fallbacks0 = torch.tpu.metrics()["cpu_fallbacks"]
    chk = Checker()
    W, R = world, rank
    peer = 1 - R
    Op = dist.ReduceOp

    def both(name, make, run):
        """Runs run(make(device)) for CPU (Gloo) and tpu (tpu_dist) and compares everything
        make created (the caller's tensors after the call) and what run returned."""
        cpu, tpu = make("cpu"), make("tpu")
        try:
            rc = run(cpu)
        except Exception as e:  # noqa: BLE001
            return chk.fail(name, f"the CPU reference raised {type(e).__name__}: {e}")
        try:
            rt = run(tpu)
        except Exception as e:  # noqa: BLE001
            return chk.fail(name, f"raised {type(e).__name__}: {e}")
        chk.same(name, (tpu, rt), (cpu, rc))

    def v(case, shape, dtype=torch.float32, r=None):
        return values(case, shape, dtype, R if r is None else r)

    floats = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
    ints = (torch.int8, torch.uint8, torch.int32, torch.int64)

    # --- all_reduce: every op, every dtype Gloo has --------------------------------------------
    for dt in floats:
        for op in (Op.SUM, Op.AVG, Op.PRODUCT, Op.MIN, Op.MAX):
            case = f"all_reduce {op} {dt}"
            both(case, lambda d, c=case, dt=dt: v(c, (3, 5), dt).to(d),
                 lambda x, op=op: dist.all_reduce(x, op=op))
    for dt in ints:
        for op in (Op.SUM, Op.PRODUCT, Op.MIN, Op.MAX, Op.BAND, Op.BOR, Op.BXOR):
            case = f"all_reduce {op} {dt}"
            both(case, lambda d, c=case, dt=dt: v(c, (7,), dt).to(d),
                 lambda x, op=op: dist.all_reduce(x, op=op))
    for op in (Op.SUM, Op.MIN, Op.MAX):
        case = f"all_reduce {op} bool"
        both(case, lambda d, c=case: v(c, (9,), torch.bool).to(d),
             lambda x, op=op: dist.all_reduce(x, op=op))
    for dt in (torch.complex64, torch.complex128):
        for op in (Op.SUM, Op.AVG):
            case = f"all_reduce {op} {dt}"
            both(case, lambda d, c=case, dt=dt: v(c, (4,), dt).to(d),
                 lambda x, op=op: dist.all_reduce(x, op=op))
    both("all_reduce 0-d", lambda d: v("0d", (), torch.float32).to(d), dist.all_reduce)
    both("all_reduce empty", lambda d: torch.empty(0, device=d), dist.all_reduce)
    both("all_reduce large", lambda d: v("large", (1 << 18,)).to(d), dist.all_reduce)

    # int16: Gloo has no int16; the reference is the int32 all_reduce narrowed to int16.
    for op in (Op.SUM, Op.PRODUCT, Op.MIN, Op.MAX, Op.BAND, Op.BOR, Op.BXOR):
        x = v(f"int16 {op}", (6,), torch.int16) * 300
        ref = x.to(torch.int32)
        dist.all_reduce(ref, op=op)
        t = x.to("tpu")
        dist.all_reduce(t, op=op)
        chk.same(f"all_reduce {op} int16", t, ref.to(torch.int16))

    # PREMUL_SUM: Gloo refuses it; the reference is Gloo's SUM of the pre-scaled inputs.
    for dt in (torch.float32, torch.bfloat16):
        for factor in (0.25, torch.tensor(0.5, dtype=dt)):
            x = v(f"premul {dt}", (5,), dt)
            ref = x * factor
            dist.all_reduce(ref)
            t = x.to("tpu")
            f = factor.to("tpu") if isinstance(factor, torch.Tensor) else factor
            dist.all_reduce(t, op=dist._make_nccl_premul_sum(f))
            chk.same(f"all_reduce premul_sum {dt} {type(factor).__name__}", t, ref)

    # --- argument errors raise at the call and leave the group usable --------------------------
    for name, call in (
        ("AVG of int64", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int64, device="tpu"),
                                                 op=Op.AVG)),
        ("BAND of float", lambda: dist.all_reduce(torch.ones(3, device="tpu"), op=Op.BAND)),
        ("all_gather list too short", lambda: dist.all_gather(
            [torch.empty(3, device="tpu")], torch.ones(3, device="tpu"))),
        ("all_gather_into_tensor wrong size", lambda: dist.all_gather_into_tensor(
            torch.empty(5, device="tpu"), torch.ones(3, device="tpu"))),
        ("all_to_all_single bad splits", lambda: dist.all_to_all_single(
            torch.empty(4, device="tpu"), torch.ones(4, device="tpu"), [1, 1], [3, 3])),
    ):
        try:
            call()
            chk.fail(name, "did not raise")
        except (ValueError, RuntimeError, TypeError):
            chk.true(name, True)
    both("all_reduce after argument errors", lambda d: v("after", (4,)).to(d), dist.all_reduce)

    # --- broadcast, reduce ---------------------------------------------------------------------
    for root in range(W):
        for dt in (torch.float32, torch.int64, torch.bfloat16, torch.bool, torch.uint8):
            case = f"broadcast root {root} {dt}"
            both(case, lambda d, c=case, dt=dt: v(c, (2, 3), dt).to(d),
                 lambda x, root=root: dist.broadcast(x, src=root))
    for op in (Op.SUM, Op.MAX):
        case = f"reduce {op}"
        both(case, lambda d, c=case: v(c, (6,)).to(d), lambda x, op=op: dist.reduce(x, 1, op=op))

    # --- all_gather family ----------------------------------------------------------------------
    both("all_gather list",
         lambda d: ([torch.zeros(2, 3, device=d) for _ in range(W)], v("ag", (2, 3)).to(d)),
         lambda a: dist.all_gather(a[0], a[1]))
    both("all_gather into views of one buffer",
         lambda d: (torch.full((W, 5), -1.0, device=d), v("agv", (5,)).to(d)),
         lambda a: dist.all_gather(list(a[0].unbind(0)), a[1]))
    both("all_gather into non-contiguous views",
         lambda d: (torch.full((5, W + 1), -1.0, device=d), v("agn", (5,)).to(d)),
         lambda a: dist.all_gather(list(a[0].t()[:W].unbind(0)), a[1]))
    both("all_gather_into_tensor",
         lambda d: (torch.zeros(W * 4, device=d), v("agit", (4,)).to(d)),
         lambda a: dist.all_gather_into_tensor(a[0], a[1]))
    both("all_gather_into_tensor 2-d",
         lambda d: (torch.zeros(W * 3, 5, device=d), v("agit2", (3, 5)).to(d)),
         lambda a: dist.all_gather_into_tensor(a[0], a[1]))

    def fsdp_style(d):
        out = torch.zeros(W * 4, device=d)
        out[R * 4:(R + 1) * 4] = v("fsdp", (4,)).to(d)
        return out

    both("all_gather_into_tensor, input a view of the output", fsdp_style,
         lambda out: dist.all_gather_into_tensor(out, out[R * 4:(R + 1) * 4]))
    for dt in (*floats, *ints, torch.bool, torch.complex64, torch.complex128):
        case = f"all_gather_into_tensor {dt}"
        both(case, lambda d, c=case, dt=dt: (torch.zeros(W * 3, dtype=dt, device=d),
                                             v(c, (3,), dt).to(d)),
             lambda a: dist.all_gather_into_tensor(a[0], a[1]))
    x16 = v("ag int16", (3,), torch.int16)
    ref = torch.zeros(W * 3, dtype=torch.int32)
    dist.all_gather_into_tensor(ref, x16.to(torch.int32))
    t = torch.zeros(W * 3, dtype=torch.int16, device="tpu")
    dist.all_gather_into_tensor(t, x16.to("tpu"))
    chk.same("all_gather_into_tensor int16", t, ref.to(torch.int16))

    # --- reduce_scatter family ------------------------------------------------------------------
    for op in (Op.SUM, Op.MAX):
        case = f"reduce_scatter list {op}"
        both(case, lambda d, c=case: (torch.zeros(4, device=d),
                                      [v(c + str(i), (4,)).to(d) for i in range(W)]),
             lambda a, op=op: dist.reduce_scatter(a[0], a[1], op=op))
    for op in (Op.SUM, Op.AVG):
        case = f"reduce_scatter_tensor {op}"
        both(case, lambda d, c=case: (torch.zeros(2, 3, device=d), v(c, (W * 2, 3)).to(d)),
             lambda a, op=op: dist.reduce_scatter_tensor(a[0], a[1], op=op))
    both("reduce_scatter_tensor into a view",
         lambda d: (torch.full((10,), -1.0, device=d), v("rstv", (W * 4,)).to(d)),
         lambda a: dist.reduce_scatter_tensor(a[0][2:6], a[1]))

    # --- all_to_all family ----------------------------------------------------------------------
    both("all_to_all list",
         lambda d: ([torch.zeros(3, device=d) for _ in range(W)],
                    [v(f"a2a{i}", (3,)).to(d) for i in range(W)]),
         lambda a: dist.all_to_all(a[0], a[1]))
    # Uneven: rank r sends 1 + r + dst elements to dst. Gloo's list all_to_all needs tensors of
    # one size (NCCL's does not); the reference is Gloo's all_to_all_single with those splits.
    ins_u = [v(f"a2au{i}", (1 + R + i,)) for i in range(W)]
    ref = torch.zeros(sum(1 + src + R for src in range(W)))
    dist.all_to_all_single(ref, torch.cat(ins_u), [1 + src + R for src in range(W)],
                           [1 + R + dst for dst in range(W)])
    t_outs = [torch.zeros(1 + src + R, device="tpu") for src in range(W)]
    dist.all_to_all(t_outs, [t.to("tpu") for t in ins_u])
    chk.same("all_to_all list uneven", t_outs,
             list(ref.split([1 + src + R for src in range(W)])))
    both("all_to_all_single",
         lambda d: (torch.zeros(W * 2, 3, device=d), v("a2as", (W * 2, 3)).to(d)),
         lambda a: dist.all_to_all_single(a[0], a[1]))
    ins = [1 + R + dst for dst in range(W)]
    outs = [1 + src + R for src in range(W)]
    both("all_to_all_single uneven splits",
         lambda d: (torch.zeros(sum(outs), 2, device=d), v("a2asu", (sum(ins), 2)).to(d)),
         lambda a: dist.all_to_all_single(a[0], a[1], outs, ins))
    # Gloo refuses a non-contiguous input here; the reference uses a contiguous copy.
    base = v("a2anc", (3, W * 2))
    ref_out = torch.zeros(W * 2, 3)
    dist.all_to_all_single(ref_out, base.t().contiguous())
    t_out = torch.zeros(W * 2, 3, device="tpu")
    t_base = base.to("tpu")
    dist.all_to_all_single(t_out, t_base.t())
    chk.same("all_to_all_single non-contiguous input", (t_out, t_base), (ref_out, base))

    # --- gather, scatter, barrier ------------------------------------------------------------------
    both("gather",
         lambda d: ([torch.zeros(4, device=d) for _ in range(W)] if R == 0 else None,
                    v("gather", (4,)).to(d)),
         lambda a: dist.gather(a[1], a[0], dst=0))
    both("scatter",
         lambda d: (torch.zeros(4, device=d),
                    [v(f"scatter{i}", (4,)).to(d) for i in range(W)] if R == 1 else None),
         lambda a: dist.scatter(a[0], a[1], src=1))
    dist.barrier()
    chk.true("barrier", True)

    # --- send / recv ---------------------------------------------------------------------------------
    def send_recv(a):
        x, y = a
        if R == 0:
            dist.send(x, 1, tag=3)
            dist.recv(y, 1, tag=3)
        else:
            dist.recv(y, 0, tag=3)
            dist.send(x, 0, tag=3)

    both("send/recv", lambda d: (v("sr", (5,)).to(d), torch.zeros(5, device=d)), send_recv)

    def isend_irecv_both(a):
        x, y = a
        works = [dist.irecv(y, peer), dist.isend(x, peer)]
        for w in reversed(works):
            w.wait()

    both("isend/irecv both ways at once",
         lambda d: (v("isr", (3, 2)).to(d), torch.zeros(3, 2, device=d)), isend_irecv_both)

    def batch(a):
        x, y = a
        ops = [dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, y, peer)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    both("batch_isend_irecv", lambda d: (v("batch", (4,)).to(d), torch.zeros(4, device=d)), batch)

    def any_source(a):
        x, y = a
        if R == 0:
            dist.send(x, 1)
            return -1
        return dist.recv(y)  # from any source: returns the sender

    both("recv from any source",
         lambda d: (v("any", (3,)).to(d), torch.zeros(3, device=d)), any_source)

    # A recv from one source while a recv from any source on that tag is pending is refused
    # (it could take the message meant for the other); the pending one still completes. Rank 0
    # sends only once rank 1 has tried: a message that arrived first would complete the pending
    # recv, and the second recv would then rightly wait for a message that never comes.
    if R == 0:
        dist.recv(torch.zeros(1, device="tpu"), 1, tag=10)
        dist.send(torch.full((3,), 5.0, device="tpu"), 1, tag=9)
    else:
        y = torch.zeros(3, device="tpu")
        w = dist.irecv(y, tag=9)
        try:
            dist.recv(torch.zeros(3, device="tpu"), 0, tag=9)
            chk.fail("recv while a recv from any source is pending", "did not raise")
        except ValueError:
            chk.true("recv while a recv from any source is pending raises", True)
        dist.send(torch.ones(1, device="tpu"), 0, tag=10)
        w.wait()
        chk.same("the pending recv from any source", y, torch.full((3,), 5.0))

    # A send and recv called after a collective that waits for the peer do not wait for it.
    if R == 0:
        w = dist.all_reduce(torch.ones(2, device="tpu"), async_op=True)
        dist.send(torch.full((2,), 7.0, device="tpu"), 1)
        w.wait()
    else:
        got = torch.zeros(2, device="tpu")
        dist.recv(got, 0)
        dist.all_reduce(torch.ones(2, device="tpu"))
        chk.same("recv before the peer's earlier collective", got, torch.full((2,), 7.0))

    # --- coalesced ---------------------------------------------------------------------------------
    both("all_reduce_coalesced",
         lambda d: [v("arc0", (3,)).to(d), v("arc1", (2, 2)).to(d)],
         lambda xs: dist.all_reduce_coalesced(xs))

    def coalesced(kind):
        def run(a):
            with dist._coalescing_manager(async_ops=True) as cm:
                if kind == "all_reduce":
                    for x in a:
                        dist.all_reduce(x)
                elif kind == "all_gather_into_tensor":
                    for out, x in a:
                        dist.all_gather_into_tensor(out, x)
                else:
                    for out, x in a:
                        dist.reduce_scatter_tensor(out, x)
            cm.wait()
        return run

    both("coalescing manager all_reduce",
         lambda d: [v("cm0", (3,)).to(d), v("cm1", (5,)).to(d)], coalesced("all_reduce"))
    both("coalescing manager all_gather_into_tensor",
         lambda d: [(torch.zeros(W * 3, device=d), v("cmag0", (3,)).to(d)),
                    (torch.zeros(W * 2, device=d), v("cmag1", (2,)).to(d))],
         coalesced("all_gather_into_tensor"))
    both("coalescing manager reduce_scatter_tensor",
         lambda d: [(torch.zeros(3, device=d), v("cmrs0", (W * 3,)).to(d)),
                    (torch.zeros(2, device=d), v("cmrs1", (W * 2,)).to(d))],
         coalesced("reduce_scatter_tensor"))
    both("all_gather_coalesced",
         lambda d: ([[torch.zeros(3, device=d), torch.zeros(2, device=d)] for _ in range(W)],
                    [v("agc0", (3,)).to(d), v("agc1", (2,)).to(d)]),
         lambda a: dist.all_gather_coalesced(a[0], a[1]))

    # --- views and non-contiguous tensors ---------------------------------------------------------
    both("all_reduce of a row (offset view)", lambda d: v("row", (3, 4)).to(d),
         lambda x: dist.all_reduce(x[1]))
    # Gloo's allreduce reads a non-contiguous CPU tensor as if it were contiguous; the reference
    # reduces a contiguous copy and writes it back through the view.
    base = v("nc", (3, 4))
    view = base.t()[1:3]
    c = view.contiguous()
    dist.all_reduce(c)
    view.copy_(c)
    t_base = v("nc", (3, 4)).to("tpu")
    dist.all_reduce(t_base.t()[1:3])
    chk.same("all_reduce of a transposed slice", t_base, base)

    # --- async work semantics ----------------------------------------------------------------------
    x = v("async", (4,)).to("tpu")
    ref = v("async", (4,))
    dist.all_reduce(ref)
    w = dist.all_reduce(x, async_op=True)
    fut = w.get_future()
    seen = []
    chained = fut.then(lambda f: seen.append(f.value()[0].cpu()) or f.value()[0] * 2)
    chk.true("work.wait() returns True", w.wait() is True)
    chk.true("work.is_completed() after wait", w.is_completed())
    chk.true("work.is_success() after wait", w.is_success())
    chk.true("work.exception() is None", w.exception() is None)
    chk.same("work result", x, ref)
    value = fut.wait()
    chk.true("future value is the caller's tensor",
             isinstance(value, list) and len(value) == 1
             and value[0].untyped_storage().data_ptr() == x.untyped_storage().data_ptr())
    chk.same("future then() sees the result", chained.wait(), ref * 2)
    chk.true("future callback ran once", len(seen) == 1 and torch.equal(seen[0], ref),
             str(seen))
    chk.same("work.result()", w.result(), [ref])

    # Asynchronous: the call returns at once even though the peer joins 1.5 s later.
    dist.barrier()
    if R == 0:
        y = torch.ones(64, device="tpu")
        t0 = time.monotonic()
        w = dist.all_reduce(y, async_op=True)
        returned = time.monotonic() - t0
        done_early = w.is_completed()
        try:
            w.wait(timeout=timedelta(milliseconds=100))
            chk.fail("wait(timeout) before completion", "did not raise")
        except RuntimeError:
            chk.true("wait(timeout) before completion raises", True)
        w.wait()
        waited = time.monotonic() - t0
        chk.true("async call returns before the peer joins", returned < 1.0 and not done_early,
                 f"returned after {returned:.2f} s, completed early: {done_early}")
        chk.true("wait() waits for the peer", waited > 1.0, f"waited {waited:.2f} s")
        chk.same("async result", y, torch.full((64,), 2.0))
    else:
        time.sleep(1.5)  # the thresholds above leave room for a loaded machine
        dist.all_reduce(torch.ones(64, device="tpu"))

    # A future callback that runs, and waits for, another collective.
    def nested(f):
        y = f.value()[0].clone()
        dist.all_reduce(y)
        return y

    x = v("nested", (3,)).to("tpu")
    got = dist.all_reduce(x, async_op=True).get_future().then(nested).wait()
    ref = v("nested", (3,))
    dist.all_reduce(ref)
    ref = ref.clone()
    dist.all_reduce(ref)
    chk.same("a collective inside a future callback", got, ref)

    # Several outstanding works, waited for in reverse order.
    a = v("out a", (3,)).to("tpu")
    out = torch.zeros(W * 2, device="tpu")
    b = v("out b", (2,)).to("tpu")
    works = [dist.all_reduce(a, async_op=True), dist.all_gather_into_tensor(out, b, async_op=True),
             dist.broadcast(b, 0, async_op=True)]
    for w in reversed(works):
        w.wait()
    ra, rout, rb = v("out a", (3,)), torch.zeros(W * 2), v("out b", (2,))
    dist.all_reduce(ra)
    dist.all_gather_into_tensor(rout, rb)
    dist.broadcast(rb, 0)
    chk.same("outstanding works", (a, out, b), (ra, rout, rb))

    # --- functional collectives (DTensor's and compiled graphs' route) ----------------------------
    group = dist.group.WORLD
    for name, fn in (
        ("all_reduce sum", lambda x: fc.all_reduce(x, "sum", group)),
        ("all_reduce max", lambda x: fc.all_reduce(x, "max", group)),
        ("all_gather_tensor", lambda x: fc.all_gather_tensor(x, 0, group)),
        ("all_gather_tensor dim 1", lambda x: fc.all_gather_tensor(x, 1, group)),
        ("reduce_scatter_tensor", lambda x: fc.reduce_scatter_tensor(x, "sum", 0, group)),
    ):
        base = v("fc " + name, (W * 2, 3))
        want = fc.wait_tensor(fn(base.clone()))
        got = fc.wait_tensor(fn(base.to("tpu")))
        chk.same(f"functional {name}", got, want)
        chk.same(f"functional {name} leaves its input", base.to("tpu"), base)

    # --- sub-groups ----------------------------------------------------------------------------------
    g_all = dist.new_group([0, 1])
    both("new_group of both ranks", lambda d: v("g", (4,)).to(d),
         lambda x: dist.all_reduce(x, group=g_all))
    g_one = dist.new_group([1])
    if R == 1:
        both("new_group of one rank", lambda d: v("g1", (4,)).to(d),
             lambda x: dist.all_reduce(x, group=g_one))
    else:
        chk.true("non-member", g_one == dist.GroupMember.NON_GROUP_MEMBER)
    g_alias = dist.new_group([0, 1], backend="tpu")
    x = v("alias", (4,)).to("tpu")
    ref = v("alias", (4,))
    dist.all_reduce(x, group=g_alias)
    dist.all_reduce(ref)
    chk.same("new_group(backend='tpu')", x, ref)
    chk.true("alias group backend", dist.get_backend(g_alias) == "tpu",
             dist.get_backend(g_alias))

    # --- defer_and_fuse: recorded ops before a collective are seen by it ---------------------------
    torch.tpu.set_eager_mode("defer_and_fuse")
    try:
        both("all_reduce in defer_and_fuse",
             lambda d: v("defer", (6,)).to(d),
             lambda x: (x.mul_(2).add_(1), dist.all_reduce(x), x.add_(1))[-1])
    finally:
        torch.tpu.set_eager_mode("strict")

    stats = td.stats()
    torch.tpu.synchronize()
    fallbacks = torch.tpu.metrics()["cpu_fallbacks"] - fallbacks0
    dist.destroy_process_group()
    return {"failures": chk.failures, "checks": chk.checks, "fallbacks": fallbacks,
            "fallback_ops": torch.tpu.fallback_ops() if fallbacks else {},
            "uploads": stats["uploads"], "zero_copy_uploads": stats["zero_copy_uploads"]}


def job_default(rank, world, init):
    """Under torchrun: init_process_group() with no backend picks tpu_dist for tpu tensors."""
    import torch
    import torch.distributed as dist

    import torch_pjrt.distributed as td

    chk = Checker()
    dist.init_process_group()  # env://, backend chosen for the accelerator (tpu)
    rank = dist.get_rank()
    # (dist.get_backend() answers "undefined" after a backend-less init, on CUDA too.)
    chk.true("backend config", dist.get_backend_config() == "tpu:tpu_dist",
             dist.get_backend_config())
    name = dist.group.WORLD._get_backend(torch.device("tpu")).name()
    chk.true("tpu backend", name == "tpu_dist", name)
    chk.true("default for the device", dist.get_default_backend_for_device("tpu") == "tpu_dist")
    n = torch.tpu.device_count()
    expect = torch.device("tpu", int(os.environ["LOCAL_RANK"]) % n if n > 1 else 0)
    chk.true("local device", td.local_device() == expect, f"{td.local_device()} vs {expect}")
    chk.true("current device", torch.tpu.current_device() == expect.index,
             f"{torch.tpu.current_device()} vs {expect}")
    x = torch.full((5,), float(rank + 1), device=expect)
    dist.all_reduce(x)
    chk.same("all_reduce", x, torch.full((5,), float(sum(range(1, world + 1)))))
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    chk.true("all_gather_object", objs == [{"rank": r} for r in range(world)], str(objs))
    dist.barrier()
    dist.destroy_process_group()
    return {"failures": chk.failures, "checks": chk.checks}


def job_mismatch(rank, world, init):
    """Ranks calling different collectives raise, on every rank, without touching outputs."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    chk = Checker()
    _init(rank, world, init, "tpu_dist", timeout_s=20)
    groups = {name: dist.new_group([0, 1], timeout=timedelta(seconds=3))
              for name in ("type", "p2p", "silent")}

    def expect_raise(name, call, within, match=None, untouched=()):
        before = [t.cpu().clone() for t in untouched]
        t0 = time.monotonic()
        try:
            call()
            chk.fail(name, "did not raise")
        except Exception as e:  # noqa: BLE001
            took = time.monotonic() - t0
            chk.true(f"{name} raises within {within} s", took < within, f"took {took:.1f} s")
            chk.true(f"{name} message", match is None or match in str(e), str(e)[:500])
        for i, (t, b) in enumerate(zip(untouched, before)):
            chk.true(f"{name} leaves tensor {i} untouched", torch.equal(t.cpu(), b))

    # Sizes that do not fit: Gloo alone would abort the process.
    x = torch.full((4 if rank == 0 else 8,), 5.0, device="tpu")
    expect_raise("all_reduce of different sizes", lambda: dist.all_reduce(x), 10,
                 "called different collectives", [x])
    expect_raise("later calls on that group",
                 lambda: dist.all_reduce(torch.ones(2, device="tpu")), 1, "cannot be used")
    # Different collectives.
    y = torch.full((4,), 3.0, device="tpu")
    outs = [torch.full((4,), -1.0, device="tpu") for _ in range(world)]
    call = ((lambda: dist.all_reduce(y, group=groups["type"])) if rank == 0 else
            (lambda: dist.all_gather(outs, y, group=groups["type"])))
    expect_raise("all_reduce against all_gather", call, 10, "all_reduce", [y, *outs])
    # A send longer than its recv: the receiver raises at once, the sender within the timeout.
    g = groups["p2p"]
    if rank == 0:
        expect_raise("send longer than the recv",
                     lambda: dist.send(torch.ones(8, device="tpu"), 1, group=g), 10)
    else:
        z = torch.full((4,), 2.0, device="tpu")
        expect_raise("recv shorter than the send", lambda: dist.recv(z, 0, group=g), 5,
                     "matching send has 8", [z])
    # A rank that never calls: the other's collective fails within the group timeout (3 s).
    g = groups["silent"]
    if rank == 0:
        w = torch.ones(3, device="tpu")
        expect_raise("collective with a rank that never joins",
                     lambda: dist.all_reduce(w, group=g), 10, None, [w])
    else:
        time.sleep(5)
    return {"failures": chk.failures, "checks": chk.checks}


def job_dead(rank, world, init, out_dir):
    """Rank 1 dies after a first collective; rank 0's next collective raises within the timeout.

    The first all_reduce is what makes "after init" hold on both ranks: init_process_group can
    return on one rank while the other is still connecting its second Gloo mesh, and a rank that
    exits then fails the other's init (seen once in CI: "Connection closed by peer" from rank
    0's init_process_group), which is not the case under test."""
    import torch
    import torch.distributed as dist

    _init(rank, world, init, "tpu_dist", timeout_s=10)
    first = torch.ones(2, device="tpu")
    dist.all_reduce(first)
    if rank == 1:
        os._exit(0)
    chk = Checker()
    chk.true("first all_reduce", torch.equal(first.cpu(), torch.full((2,), 2.0)), str(first))
    time.sleep(0.5)
    x = torch.full((16,), 4.0, device="tpu")
    t0 = time.monotonic()
    try:
        dist.all_reduce(x)
        chk.fail("all_reduce with a dead peer", "did not raise")
    except Exception as e:  # noqa: BLE001
        took = time.monotonic() - t0
        chk.true("dead peer raises within the timeout", took < 10, f"took {took:.1f} s")
        chk.true("dead peer error type", isinstance(e, RuntimeError), type(e).__name__)
    chk.true("all or nothing", torch.equal(x.cpu(), torch.full((16,), 4.0)))
    try:
        dist.all_reduce(x)
        chk.fail("after the failure", "did not raise")
    except RuntimeError as e:
        chk.true("after the failure", "cannot be used" in str(e), str(e)[:300])
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"failures": chk.failures, "checks": chk.checks}, f)
    os._exit(0)  # no teardown: the group is broken and the peer is gone


def job_inference(rank, world, init):
    """Collectives on inference tensors (made under torch.inference_mode, as vLLM makes its
    activations) inside inference mode: the backend's threads write the results into them, as
    NCCL writes device memory, without the in-place checks of autograd (which refuse an
    inference tensor outside inference mode, and inference mode is per thread)."""
    import torch
    import torch.distributed as dist

    chk = Checker()
    dist.init_process_group("tpu_dist", init_method=init, rank=rank, world_size=world)
    with torch.inference_mode():
        for it in range(20):
            x = torch.full((4, 3), float(rank + 1 + it), device="tpu")
            out = torch.empty(world * 4, 3, device="tpu")
            # an asynchronous one in flight: the next call queues behind it and runs on the
            # backend's thread, the synchronous ones after it on the caller's
            z = torch.full((1000,), 1.0, device="tpu")
            w = dist.all_reduce(z, async_op=True)
            dist.all_gather_into_tensor(out, x)
            w.wait()
            chk.same(f"async all_reduce {it}", z, torch.full((1000,), float(world)))
            want = torch.cat([torch.full((4, 3), float(r + 1 + it)) for r in range(world)])
            chk.same(f"all_gather_into_tensor {it}", out, want)
            dist.all_reduce(x)
            chk.same(f"all_reduce {it}", x,
                     torch.full((4, 3), float(sum(r + 1 + it for r in range(world)))))
            y = torch.full((2,), float(rank), device="tpu")
            dist.broadcast(y, src=1)
            chk.same(f"broadcast {it}", y, torch.full((2,), 1.0))
        chk.true("inference tensors", out.is_inference() and x.is_inference())
    dist.barrier()
    dist.destroy_process_group()
    return {"failures": chk.failures, "checks": chk.checks}


JOBS = {"collectives": job_collectives, "default": job_default, "mismatch": job_mismatch,
        "inference": job_inference}


def _spawned(rank, job, world, init, out_dir):
    {"dead": job_dead}[job](rank, world, init, out_dir)


def _worker(argv):
    job, rank, world, init, out_dir = argv[1], argv[2], int(argv[3]), argv[4], argv[5]
    import torch  # noqa: F401  (autoload registers the tpu device and tpu_dist)

    import torch_pjrt  # noqa: F401

    if job.startswith("spawn:"):
        import torch.multiprocessing as mp

        mp.spawn(_spawned, args=(job[len("spawn:"):], world, init, out_dir), nprocs=world)
        return
    rank = int(os.environ["RANK"]) if rank == "env" else int(rank)
    result = JOBS[job](rank, world, init)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    _worker(sys.argv)
