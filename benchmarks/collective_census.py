"""Census of the collectives one real training step issues: FSDP2 + tensor parallelism on a
small Llama (issue 36, item 6).

A Llama-shaped causal LM (transformers' LlamaForCausalLM built from a LlamaConfig, random
weights) runs on 4 rank threads (``torch_pjrt.distributed.run_threads``), each rank on
``tpu:<rank>`` and on the native transport, over a 2 x 2 DeviceMesh ("dp", "tp"):

- tensor parallelism over "tp" (``parallelize_module``): ColwiseParallel on q/k/v_proj and
  gate/up_proj, RowwiseParallel on o_proj and down_proj (Megatron-style, no sequence
  parallelism; embeddings, norms and lm_head replicated over tp);
- FSDP2 over "dp": ``fully_shard`` on every decoder layer and on the root, with
  ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``, reshard after forward;
- AdamW; two steps; the second (steady state: nothing left to compile) is the census.

How collectives are recorded: the collective entry points of ``torch.distributed`` (the c10d
Python API: what FSDP2 calls, ``all_gather_single`` / ``reduce_scatter_single``) and of
``torch.distributed._functional_collectives`` (what DTensor's redistribute, hence tensor
parallelism, calls) are wrapped; a thread-local recorder entered on each rank thread keeps the
outermost calls (see CollectiveRecorder for why not a TorchDispatchMode). Each record: phase
(forward / backward / optimizer), kind, mesh dimension of the group, dtype, input and output
bytes per rank. Collectives issued from C++ without passing these Python functions would be
missed; in torch 2.13 FSDP2 and DTensor issue theirs from Python.

    TORCH_PJRT_CPU_DEVICE_COUNT=4 python benchmarks/collective_census.py [--json out.json]

(TORCH_PJRT_CACHE_DIR=<empty dir> for a cold compile cache: step 1's compiles then show.)

Prints a table of steady-state step collectives (rank 0; all ranks are checked to issue the
same list), the per-layer formulas derived from the model's dimensions, and whether the counts
and bytes match them. ``--json`` writes everything (benchmarks/scaling_model.py reads it with
``--census``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import threading
import time
from collections import Counter, defaultdict

os.environ.setdefault("TORCH_PJRT_CPU_DEVICE_COUNT", "4")
os.environ.setdefault("TORCH_FAKE_TENSOR_DISPATCH_CACHE", "0")  # see run()

import torch  # noqa: E402

# The model: small, but every dimension distinct so bytes identify the tensor.
DIMS = dict(layers=2, hidden=64, intermediate=160, heads=4, kv_heads=2, vocab=512)
SEQ, BATCH_PER_DP = 32, 2
DP, TP = 2, 2

_ELEM = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2, torch.float64: 8,
         torch.int64: 8, torch.int32: 4, torch.uint8: 1, torch.bool: 1, torch.int8: 1}


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


def _nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


_TLS = threading.local()  # per rank thread: the recorder and the nesting depth
# Recorders by device index. In rank threads autograd multithreading is on (torch 2.13's
# switch is thread-local: run_threads turns it off in the caller's thread only), so a rank's
# backward runs on the autograd engine's worker thread of its device (a "Dummy-N" thread, whose
# current device is the rank's): its collectives are attributed through the device.
_BY_DEVICE: dict[int, "CollectiveRecorder"] = {}

# The entry points patched: every collective of the c10d Python API (what FSDP2 calls:
# all_gather_single / reduce_scatter_single, i.e. all_gather_into_tensor / reduce_scatter_tensor)
# and of the functional collectives (what DTensor's redistribute and tensor parallelism call).
_C10D = ("all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor",
         "all_gather_single", "all_gather_coalesced", "_all_gather_base", "reduce_scatter",
         "reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base", "all_to_all",
         "all_to_all_single", "broadcast", "reduce", "gather", "scatter", "barrier",
         "all_gather_object", "broadcast_object_list", "send", "recv", "isend", "irecv")
_FUNCOL = ("all_reduce", "all_reduce_coalesced", "all_gather_tensor", "all_gather_single",
           "all_gather_tensor_autograd", "all_gather_single_autograd",
           "all_gather_into_tensor_coalesced", "reduce_scatter_tensor", "reduce_scatter_single",
           "reduce_scatter_tensor_autograd", "reduce_scatter_single_autograd",
           "reduce_scatter_tensor_coalesced", "all_to_all_single", "all_to_all_single_autograd",
           "broadcast")


class CollectiveRecorder:
    """Records, on the rank thread that enters it, every call of the collective entry points
    of ``torch.distributed`` and ``torch.distributed._functional_collectives`` (outermost
    calls only: a functional collective that goes on to call another entry point counts once).

    Why not a TorchDispatchMode over the c10d / _c10d_functional ops: tried first; with a
    Python dispatch mode active DTensor's sharding propagation takes its uncached path, whose
    FakeTensorMode is shared by the rank threads, and the step failed with
    ``FakeTensorDeviceMismatchError: ... tpu:2 and tpu:1`` on every rank."""

    _installed = False
    _lock = threading.Lock()

    def __init__(self, group_dims: dict[str, str]):
        self.group_dims = group_dims  # group_name -> "dp" / "tp" / "world"
        self.phase = "setup"
        self.records: list[dict] = []

    @classmethod
    def install(cls):
        import torch.distributed as dist
        import torch.distributed._functional_collectives as funcol
        import torch.distributed.distributed_c10d as c10d

        with cls._lock:
            if cls._installed:
                return
            for mod, names, ns in ((c10d, _C10D, "c10d"), (dist, _C10D, "c10d"),
                                   (funcol, _FUNCOL, "funcol")):
                for name in names:
                    fn = getattr(mod, name, None)
                    if fn is None or getattr(fn, "_census", False):
                        continue
                    setattr(mod, name, cls._wrap(fn, f"{ns}.{name}"))
            cls._installed = True

    @staticmethod
    def _wrap(fn, label):
        import functools

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            rec = getattr(_TLS, "rec", None)
            if rec is None and _BY_DEVICE:
                # a backward runs on the autograd engine's thread of the rank's device
                rec = _BY_DEVICE.get(torch.tpu.current_device())
            depth = getattr(_TLS, "depth", 0)
            if rec is None or depth:
                return fn(*args, **kwargs)
            _TLS.depth = depth + 1
            try:
                out = fn(*args, **kwargs)
            finally:
                _TLS.depth = depth
            rec.record(label, fn, args, kwargs, out)
            return out

        wrapper._census = True
        return wrapper

    def __enter__(self):
        self.install()
        _TLS.rec = self
        _BY_DEVICE[torch.tpu.current_device()] = self
        return self

    def __exit__(self, *exc):
        _TLS.rec = None
        _BY_DEVICE.pop(torch.tpu.current_device(), None)

    def _group(self, group):
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh

        if group is None:
            return "world"
        if isinstance(group, DeviceMesh) and group.ndim == 1:
            group = group.get_group()
        elif (isinstance(group, tuple) and len(group) == 2 and isinstance(group[0], DeviceMesh)
              and isinstance(group[1], int)):
            group = group[0].get_group(group[1])
        if isinstance(group, dist.ProcessGroup):
            group = group.group_name
        if isinstance(group, str):
            return self.group_dims.get(group, group)
        return repr(group)

    _IN = ("input_tensor", "input", "tensor", "tensors", "input_list", "input_tensor_list",
           "self", "inputs", "obj")
    _OUT = ("output_tensor", "output", "tensor_list", "output_tensor_list",
            "output_tensor_lists", "object_list")

    def record(self, label, fn, args, kwargs, out):
        import inspect

        name = label.split(".", 1)[1]
        bound = inspect.signature(fn).bind(*args, **kwargs).arguments
        ins = next((list(_tensors(bound[k])) for k in self._IN if k in bound), [])
        if label.startswith("funcol."):
            outs = list(_tensors(out))
        else:
            outs = next((list(_tensors(bound[k])) for k in self._OUT if k in bound), ins)
        dt = ins[0].dtype if ins else (outs[0].dtype if outs else None)
        self.records.append(dict(
            phase=self.phase, op=label, group=self._group(bound.get("group")),
            dtype=str(dt).replace("torch.", "") if dt is not None else "-",
            ntensors=len(ins), in_bytes=_nbytes(ins), out_bytes=_nbytes(outs),
            shapes=[list(t.shape) for t in ins][:4]))


def _kind(op: str) -> str:
    n = op.split(".", 1)[1]
    if "allreduce" in n or "all_reduce" in n:
        return "all_reduce"
    if "allgather" in n or "all_gather" in n:
        return "all_gather"
    if "reduce_scatter" in n:
        return "reduce_scatter"
    if "alltoall" in n or "all_to_all" in n:
        return "all_to_all"
    return n


def build_state(cfg_kwargs):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**cfg_kwargs)
    torch.manual_seed(0)
    return cfg, LlamaForCausalLM(cfg).state_dict()


def run(steps: int = 2):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    from transformers import LlamaForCausalLM

    from torch_pjrt.distributed import run_threads, transport

    cfg_kwargs = dict(
        vocab_size=DIMS["vocab"], hidden_size=DIMS["hidden"],
        intermediate_size=DIMS["intermediate"], num_hidden_layers=DIMS["layers"],
        num_attention_heads=DIMS["heads"], num_key_value_heads=DIMS["kv_heads"],
        max_position_embeddings=SEQ, tie_word_embeddings=False, attn_implementation="sdpa")
    cfg, state = build_state(cfg_kwargs)
    # Thread ranks share the process's FakeTensorMode dispatch cache, which DTensor's sharding
    # propagation uses: a cached fake result made on another rank's thread carries that rank's
    # device ("tpu" resolves to the thread's current device), and the step failed with
    # FakeTensorDeviceMismatchError ("tpu:3 and tpu:0") on the first TP matmul. Off for this run.
    # (TORCH_FAKE_TENSOR_DISPATCH_CACHE=0 above, before torch is imported: setting
    # torch._dynamo.config.fake_tensor_cache_enabled here did not reach the rank threads.)
    if os.environ.get("CENSUS_FAKE_LOCK") != "0":
        from torch.distributed.tensor._sharding_prop import ShardingPropagator

        ShardingPropagator._fake_mode_lock = threading.Lock()
    build_lock = threading.Lock()
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, DIMS["vocab"], (DP * BATCH_PER_DP, SEQ + 1), generator=g)

    def fn(rank):
        mesh = init_device_mesh("tpu", (DP, TP), mesh_dim_names=("dp", "tp"))
        dims = {mesh.get_group("dp").group_name: "dp", mesh.get_group("tp").group_name: "tp",
                dist.group.WORLD.group_name: "world"}
        transports = {d: transport(mesh.get_group(d)) for d in ("dp", "tp")}
        with build_lock:  # the default generator is per process: build one at a time
            model = LlamaForCausalLM(cfg)
            model.load_state_dict(state)
        model = model.to("tpu")
        rec = CollectiveRecorder(dims)
        compiles = []
        with rec:
            rec.phase = "parallelize"
            plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
                    "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
                    "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                    "mlp.down_proj": RowwiseParallel()}
            for layer in model.model.layers:
                parallelize_module(layer, mesh["tp"], plan)
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh["dp"], mp_policy=mp)
            fully_shard(model, mesh=mesh["dp"], mp_policy=mp)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            dp_rank = mesh.get_local_rank("dp")
            rows = tokens[dp_rank * BATCH_PER_DP:(dp_rank + 1) * BATCH_PER_DP].to("tpu")
            losses = []
            for step in range(steps):
                m0 = torch.tpu.metrics()
                t0 = time.perf_counter()
                rec.phase = f"step{step}/forward"
                logits = model(input_ids=rows[:, :-1]).logits
                loss = torch.nn.functional.cross_entropy(
                    logits.float().reshape(-1, DIMS["vocab"]), rows[:, 1:].reshape(-1))
                rec.phase = f"step{step}/backward"
                loss.backward()
                rec.phase = f"step{step}/optimizer"
                opt.step()
                opt.zero_grad()
                losses.append(float(loss.detach().cpu()))
                torch.tpu.synchronize()
                m1 = torch.tpu.metrics()
                compiles.append(dict(
                    {k: m1[k] - m0[k] for k in ("compiles", "cache_misses", "disk_cache_hits",
                                                "executions", "transfers_to_host")},
                    wall_s=round(time.perf_counter() - t0, 3)))
        return dict(records=rec.records, transports=transports, losses=losses,
                    compiles=compiles)

    t0 = time.time()
    results = run_threads(fn, DP * TP, timeout=600)
    return results, time.time() - t0


# ---- formulas -------------------------------------------------------------------------

def layer_param_counts(hidden, intermediate, heads, kv_heads, **_):
    hd = hidden // heads
    attn = hidden * hidden * 2 + 2 * hidden * kv_heads * hd  # q, o; k, v
    mlp = 3 * hidden * intermediate
    norms = 2 * hidden
    return dict(attn=attn, mlp=mlp, norms=norms, total=attn + mlp + norms)


def expected_per_step(layers, hidden, intermediate, heads, kv_heads, vocab, seq, batch_per_dp,
                      dp, tp, pbytes=2, gbytes=4, abytes=2):
    """Per-rank collectives of one steady-state step of this recipe (the model that
    scaling_model.py scales up), as {(phase, kind, group): (count, in_bytes_total)}.

    FSDP2 (dp), per fully_shard unit (each layer; the root holds embeddings, final norm,
    lm_head): forward one all_gather of the unit's local shard (bf16), backward one all_gather
    again (resharded after forward; the root is not resharded) and one reduce_scatter of its
    gradients (fp32). The unit's parameters on a rank are its 1/tp slice (TP-sharded weights)
    or all of it (norms), sharded 1/dp by FSDP: input bytes = params_local/dp * bytes.
    TP (tp), per layer: forward one all_reduce of the attention output and one of the MLP
    output (RowwiseParallel), [b, s, hidden] activations in the compute dtype; backward one
    all_reduce per ColwiseParallel module of its input gradient (q, k, v, gate, up: 5).
    """
    pc = layer_param_counts(hidden, intermediate, heads, kv_heads)
    layer_local = (pc["attn"] + pc["mlp"]) // tp + pc["norms"]
    root = 2 * vocab * hidden + hidden
    act = batch_per_dp * seq * hidden * abytes
    e = {}

    def add(key, n, b):
        c, t = e.get(key, (0, 0))
        e[key] = (c + n, t + b)

    for _ in range(layers):
        add(("forward", "all_gather", "dp"), 1, layer_local // dp * pbytes)
        add(("backward", "all_gather", "dp"), 1, layer_local // dp * pbytes)
        add(("backward", "reduce_scatter", "dp"), 1, layer_local * gbytes)
        add(("forward", "all_reduce", "tp"), 2, 2 * act)
        add(("backward", "all_reduce", "tp"), 5, 5 * act)
    add(("forward", "all_gather", "dp"), 1, root // dp * pbytes)
    add(("backward", "reduce_scatter", "dp"), 1, root * gbytes)
    return e


def summarize(records, step):
    table = Counter()
    nbytes = defaultdict(int)
    out_bytes = defaultdict(int)
    dtypes = defaultdict(set)
    for r in records:
        if not r["phase"].startswith(f"step{step}/"):
            continue
        key = (r["phase"].split("/")[1], _kind(r["op"]), r["group"], r["op"])
        table[key] += 1
        nbytes[key] += r["in_bytes"]
        out_bytes[key] += r["out_bytes"]
        dtypes[key].add(r["dtype"])
    return [dict(phase=k[0], kind=k[1], group=k[2], op=k[3], count=c, in_bytes=nbytes[k],
                 out_bytes=out_bytes[k], dtypes=sorted(dtypes[k])) for k, c in table.items()]


def distinct_programs(records, step):
    """Distinct (op, group, dtype, input shapes) in a step: the collective programs a rank's
    group needs (the native transport compiles one per description and placement)."""
    return len({(r["op"], r["group"], r["dtype"], json.dumps(r["shapes"]))
                for r in records if r["phase"].startswith(f"step{step}/")})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the census here")
    args = ap.parse_args(argv)
    results, wall = run()
    r0 = results[0]
    steady = summarize(r0["records"], 1)
    # every rank issues the same collectives, in the same order
    seqs = [[(r["phase"], r["op"], r["group"], r["dtype"], r["in_bytes"]) for r in res["records"]]
            for res in results]
    same = all(s == seqs[0] for s in seqs)
    exp = expected_per_step(**DIMS, seq=SEQ, batch_per_dp=BATCH_PER_DP, dp=DP, tp=TP)
    got = defaultdict(lambda: [0, 0])
    for row in steady:
        k = (row["phase"], row["kind"], row["group"])
        got[k][0] += row["count"]
        got[k][1] += row["in_bytes"]
    checks = []
    for k in sorted(set(exp) | set(got)):
        ec, eb = exp.get(k, (0, 0))
        gc, gb = got.get(k, (0, 0))
        checks.append(dict(phase=k[0], kind=k[1], group=k[2], expected_count=ec, count=gc,
                           expected_bytes=eb, bytes=gb, ok=(ec, eb) == (gc, gb)))

    print(f"collective census: Llama {DIMS}, seq {SEQ}, batch {BATCH_PER_DP} per dp rank, "
          f"mesh dp={DP} x tp={TP}, transports {r0['transports']}, torch {torch.__version__}")
    print(f"losses rank 0: {r0['losses']}; all ranks same collective sequence: {same}; "
          f"wall {wall:.1f} s")
    for i, m in enumerate(r0["compiles"]):
        print(f"  step {i + 1}, process-wide runtime metrics (all programs, all ranks; rank 0's "
              f"view): {m}")
    for phase in ("parallelize", "step0", "step1"):
        n = sum(1 for r in r0["records"] if r["phase"].startswith(phase))
        print(f"  {phase}: {n} collectives on rank 0, distinct descriptions "
              f"{distinct_programs(r0['records'], phase[-1]) if phase != 'parallelize' else '-'}")
    print("\nsteady-state step (step 2), rank 0:")
    print(f"| phase | kind | group | op | count | dtype | input bytes | output bytes |")
    print("|---|---|---|---|---:|---|---:|---:|")
    for row in sorted(steady, key=lambda r: (r["phase"], r["group"], r["kind"])):
        print(f"| {row['phase']} | {row['kind']} | {row['group']} | `{row['op']}` | {row['count']} "
              f"| {','.join(row['dtypes'])} | {row['in_bytes']} | {row['out_bytes']} |")
    print("\nagainst the per-layer formulas (expected_per_step):")
    print("| phase | kind | group | expected count | count | expected input bytes | input bytes | ok |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    for c in checks:
        print(f"| {c['phase']} | {c['kind']} | {c['group']} | {c['expected_count']} | {c['count']} "
              f"| {c['expected_bytes']} | {c['bytes']} | {'yes' if c['ok'] else 'NO'} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(date=datetime.date.today().isoformat(), dims=DIMS, seq=SEQ,
                           batch_per_dp=BATCH_PER_DP, dp=DP, tp=TP,
                           transports=r0["transports"], compiles_per_step=r0["compiles"],
                           same_on_all_ranks=same, steady=steady, checks=checks,
                           records_rank0=r0["records"]), f, indent=1)
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
