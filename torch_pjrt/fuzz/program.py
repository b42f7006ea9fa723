"""Random programs: generation (on CPU), execution on one side, and the CPU-vs-tpu comparison.

A program is JSON: {"seed", "mode", "steps": [...]}; step i defines var "i" (or "i.k" for the
k-th element of a sequence result). Input steps are {"op": "input", "kw": {shape, dtype, lo, hi,
layout, seed}}: the values come from a seeded CPU generator, then move to the side's device, and
the layout (transposed, stepped slice, offset) is applied there, so the tpu input is a real
non-contiguous view of a tpu storage. A step whose inputs are undefined (they raised, or
minimization dropped them) is skipped on both sides, which keeps every sub-program runnable.
"""
from __future__ import annotations

import math
import random
import re
import warnings

import torch

from . import ops as O

TPU = "tpu"
LAYOUTS = ("contig", "contig", "contig", "t", "step", "offset")

# Values: |a - b| <= atol + rtol * |b| per dtype (NaN positions and infinities must agree).
TOL = {torch.float32: (1e-4, 1e-5), torch.float64: (1e-7, 1e-9), torch.bfloat16: (1.6e-2, 1e-2)}


# ---------------------------------------------------------------- helpers both sides share

def make_input(kw, dev):
    shape, dtype, layout = list(kw["shape"]), getattr(torch, kw["dtype"]), kw["layout"]
    g = torch.Generator().manual_seed(kw["seed"])
    base = list(shape)
    if layout == "t" and len(shape) >= 2:
        base[-1], base[-2] = base[-2], base[-1]
    elif layout == "step" and shape:
        base[-1] = 2 * base[-1] + 1
    elif layout == "offset" and shape:
        base[0] += 1
    if dtype.is_floating_point:
        lo = kw.get("lo")
        v = torch.randn(base, generator=g, dtype=torch.float64) * 2
        if lo is not None:
            v = v.abs() + lo
        v = v.to(dtype)
    elif dtype == torch.bool:
        v = torch.randint(0, 2, base, generator=g).bool()
    else:
        lo, hi = kw.get("lo"), kw.get("hi")
        v = torch.randint(-5 if lo is None else lo, 10 if hi is None else hi, base,
                          generator=g).to(dtype)
    v = v.to(dev)
    if layout == "t" and len(shape) >= 2:
        v = v.transpose(-1, -2)
    elif layout == "step" and shape:
        v = v[..., ::2]
    elif layout == "offset" and shape:
        v = v[1:]
    return v


def _namespace(dev):
    def T(values, dtype):
        return torch.tensor(values, dtype=getattr(torch, dtype), device=dev)

    def S(x, key, value):
        x[key] = value
        return x

    return {"torch": torch, "T": T, "S": S}


_CODE: dict = {}


def _compiled(expr, nins):
    key = (expr, nins)
    code = _CODE.get(key)
    if code is None:
        code = compile(expr.format(*["_v%d" % i for i in range(nins)]), "<fuzz>", "eval")
        _CODE[key] = code
    return code


class Side:
    """One side's program state: env (ref -> tensor) and the namespace expressions run in."""

    def __init__(self, dev):
        self.dev = dev
        self.env: dict = {}
        self.ns = _namespace(dev)

    def run_step(self, i, step):
        """Runs step i. Returns None (skipped), ("exc", type name) or ("ok", [refs])."""
        if step["op"] == "input":
            self.env[str(i)] = make_input(step["kw"], self.dev)
            return ("ok", [str(i)])
        if any(r not in self.env for r in step["in"]):
            return None
        ns = dict(self.ns)
        for k, r in enumerate(step["in"]):
            ns["_v%d" % k] = self.env[r]
        try:
            out = eval(_compiled(step["expr"], len(step["in"])), ns)
        except Exception as e:  # the type is what is compared
            return ("exc", type(e).__name__, str(e).split("\n")[0][:200])
        if step.get("tuple"):
            refs = []
            for k, t in enumerate(out):
                self.env["%d.%d" % (i, k)] = t
                refs.append("%d.%d" % (i, k))
            return ("ok", refs)
        if not isinstance(out, torch.Tensor):
            return ("exc", "NotATensor", repr(type(out)))
        self.env[str(i)] = out
        return ("ok", [str(i)])


# ---------------------------------------------------------------- generation

# The bounded shape vocabulary (shapes="vocab"): a few shapes per rank, still with 0- and
# 1-size dims, so that the programs of most steps were compiled before (in memory and in the
# persistent cache) and a program costs its executions, not its compilations. Layouts, dtypes,
# broadcasting partners and invalid arguments are drawn as in "free".
VOCAB = {0: [[]],
         1: [[0], [1], [4]],
         2: [[3, 4], [0, 4], [4, 1]],
         3: [[2, 3, 4], [1, 3, 1]],
         4: [[2, 1, 3, 4]]}
SHAPES = ("free", "vocab")




def _shape(rng, shapes="free"):
    nd = rng.choices([0, 1, 2, 3, 4], [1, 3, 4, 2, 1])[0]
    if shapes == "vocab":
        return list(rng.choice(VOCAB[nd]))
    return [rng.choices([0, 1, 2, 3, 4, 5], [0.3, 2, 2, 2, 1.5, 1])[0] for _ in range(nd)]


def generate(seed: int, mode: str, min_ops=5, max_ops=50, shapes="free") -> dict:
    """A program of min_ops..max_ops ops (inputs not counted), generated by running it on CPU.

    shapes: "free" (each dim drawn from 0..5) or "vocab" (input shapes from VOCAB, slicing keys
    from a few patterns: far fewer distinct programs to compile)."""
    if shapes not in SHAPES:
        raise ValueError("shapes must be one of %s" % (SHAPES,))
    rng = random.Random(seed)
    cpu = Side("cpu")
    steps: list = []
    usable: dict = {}

    def add_input(shape, dtype=None, lo=None, hi=None, layout=None):
        if layout is None and shapes == "vocab" and steps:
            # Later inputs (mostly second operands) are contiguous more often: fewer programs.
            layout = rng.choice(LAYOUTS + ("contig",) * 6)
        kw = {"shape": list(shape), "dtype": dtype or rng.choice(O.DTYPES + O.FLOATS * 2),
              "layout": layout or rng.choice(LAYOUTS), "seed": rng.randrange(1 << 30)}
        if lo is not None:
            kw["lo"], kw["hi"] = lo, hi
        steps.append({"op": "input", "kw": kw})
        i = len(steps) - 1
        cpu.run_step(i, steps[-1])
        usable[str(i)] = cpu.env[str(i)]
        return str(i)

    for _ in range(rng.randrange(1, 4)):
        add_input(_shape(rng, shapes))
    names = list(O.TABLE)
    weights = [O.TABLE[n][1] for n in names]
    nops, tries = rng.randrange(min_ops, max_ops + 1), 0
    count = 0
    while count < nops and tries < nops * 5:
        tries += 1
        if rng.random() < 0.08:
            add_input(_shape(rng, shapes))
        gen = O.TABLE[rng.choices(names, weights)[0]][0]
        ctx = O.Ctx(rng, usable, mode, add_input, vocab=shapes == "vocab")
        step = gen(ctx)
        if step is None:
            continue
        steps.append(step)
        i = len(steps) - 1
        res = cpu.run_step(i, step)
        if res and res[0] == "ok" and _mutates(step) and \
                torch._debug_has_internal_overlap(cpu.env[step["in"][0]]) != 0:
            # A write through a self-overlapping view that CPU accepts has no defined result
            # (how often each location is written is up to the kernel): not generated.
            for r in res[1]:
                del cpu.env[r]
            steps.pop()
            continue
        count += 1
        if res and res[0] == "ok":
            for k, r in enumerate(res[1]):
                t = cpu.env[r]
                # Huge values only turn into inf/NaN chains; unstable orders never feed steps.
                if k in step.get("unstable", ()) or t.numel() > 4096:
                    continue
                usable[r] = t
    prog = {"seed": seed, "mode": mode, "steps": steps}
    if shapes != "free":
        prog["shapes"] = shapes
    return prog


# ---------------------------------------------------------------- comparison

def _ptr(t):
    s = t.untyped_storage()
    return s.data_ptr() if s.nbytes() > 0 else None


def aliases(env, ref):
    """Refs of other live vars sharing ref's storage (0-byte storages share nothing)."""
    p = _ptr(env[ref])
    if p is None:
        return set()
    return {r for r, t in env.items() if r != ref and _ptr(t) == p}


def values_differ(a: torch.Tensor, b: torch.Tensor) -> str | None:
    """a: CPU result, b: tpu result copied to CPU. None when equal within the dtype's tolerance."""
    if a.shape != b.shape:
        return "shape %s vs %s" % (tuple(a.shape), tuple(b.shape))
    if a.numel() == 0:
        return None
    if not a.dtype.is_floating_point:
        if torch.equal(a, b):
            return None
        bad = (a != b).nonzero()[0].tolist()
        return "at %s: cpu %s tpu %s" % (bad, a[tuple(bad)].item(), b[tuple(bad)].item())
    rtol, atol = TOL.get(a.dtype, (1e-4, 1e-5))
    x, y = a.double(), b.double()
    nan_x, nan_y = x.isnan(), y.isnan()
    if not torch.equal(nan_x, nan_y):
        bad = (nan_x != nan_y).nonzero()[0].tolist()
        return "NaN at %s: cpu %s tpu %s" % (bad, x[tuple(bad)].item(), y[tuple(bad)].item())
    fin = ~nan_x
    inf = x.isinf() | y.isinf()
    if not torch.equal(x[fin & inf], y[fin & inf]):
        return "inf positions differ"
    ok = fin & ~inf
    err = (x[ok] - y[ok]).abs() - (atol + rtol * y[ok].abs())
    if err.numel() and err.max().item() > 0:
        j = err.argmax().item()
        return "max error: cpu %r tpu %r" % (x[ok][j].item(), y[ok][j].item())
    return None


def bitwise_equal(a, b) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point:
        return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0), b.nan_to_num(0))
    return torch.equal(a, b)


def strides_differ(a, b) -> bool:
    if a.numel() <= 1:
        return False
    return any(s > 1 and x != y for s, x, y in zip(a.shape, a.stride(), b.stride()))


_DIM = re.compile(r"dim=(-?\d+)")


def _unstable_ok(step, cpu, tpu_t, cpu_env, k):
    """An index output whose order PyTorch leaves open is valid when it selects the same values."""
    x = cpu_env[step["in"][0]]
    idx = tpu_t.cpu()
    if idx.dtype != torch.int64 or x.dim() == 0:
        return values_differ(cpu, idx) is None
    m = _DIM.search(step["expr"])
    d = int(m.group(1)) if m else -1
    if x.dim() != idx.dim():
        idx_u = idx.unsqueeze(d)
        got = torch.gather(x, d, idx_u).squeeze(d)
        want = torch.gather(x, d, cpu.unsqueeze(d)).squeeze(d)
    else:
        if (idx < 0).any() or (idx >= max(x.shape[d], 1)).any():
            return False
        got = torch.gather(x, d, idx) if idx.numel() else idx
        want = torch.gather(x, d, cpu) if cpu.numel() else cpu
    return values_differ(want, got) is None


def _mutates(step) -> bool:
    e = step.get("expr", "")
    return "_(" in e or e.startswith("S(") or "out=" in e


class Failure(Exception):
    def __init__(self, step, kind, detail, op, ref=None):
        super().__init__("step %s %s %s: %s" % (step, op, kind, detail))
        self.step, self.kind, self.detail, self.op, self.ref = step, kind, detail, op, ref

    def as_dict(self):
        return {"step": self.step, "kind": self.kind, "detail": self.detail, "op": self.op,
                "ref": self.ref}


def _host(t, i, op, ref):
    """t copied to the host; a device error while reading becomes a Failure of step i."""
    try:
        return t.cpu()
    except Exception as e:
        raise Failure(i, "tpu_error", "reading back: %s(%s)" % (type(e).__name__,
                      str(e).split("\n")[0][:200]), op, ref) from None


def _compare_values(prog, i, refs, cpu, tpu, op="end"):
    for r in refs:
        if r not in cpu.env or r not in tpu.env:
            continue
        d = values_differ(cpu.env[r], _host(tpu.env[r], i, op, r))
        if d:
            return r, d
    return None


def execute(prog, mode, every_step=None, stop_after=None, trace=None):
    """Runs prog on CPU and tpu. Raises Failure at the first difference; returns (cpu, tpu).

    every_step: compare each result's values at once (default: all modes but defer_and_fuse,
    where values are compared at a few seeded checkpoints and at the end, so that flushes stay
    rare and fusion is what runs)."""
    warnings.filterwarnings("ignore")  # resize-of-out and fallback notices are not results
    torch.tpu.set_eager_mode(mode)
    if every_step is None:
        every_step = mode != "defer_and_fuse"
    rng = random.Random(prog["seed"] ^ 0x5EED)
    cpu, tpu = Side("cpu"), Side(TPU)
    steps = prog["steps"]
    for i, step in enumerate(steps):
        if stop_after is not None and i > stop_after:
            break
        if trace:
            trace(i)
        op = step["op"] if step["op"] != "input" else "input"
        rc = cpu.run_step(i, step)
        rt = tpu.run_step(i, step)
        if step.get("oor") and mode != "debug" and rt is not None and rt[0] != "exc":
            # Strict and defer_and_fuse check indices on the device: CPU's exception comes at
            # the next synchronizing point, so synchronize here to take it at this step
            try:
                torch.tpu.synchronize()
            except Exception as e:
                for r in rt[1]:  # the step raised: its results are not defined, as on CPU
                    tpu.env.pop(r, None)
                rt = ("exc", type(e).__name__, str(e).split("\n")[0][:200])
        if rc is None and rt is None:
            continue
        deferred = False
        if mode == "defer_and_fuse" and rc is not None and rc[0] == "exc" and rt is not None \
                and rt[0] == "ok":
            # A check made by a lowering runs when the recorded op is built, at the next flush:
            # flush here; CPU's exception type from it is a deferred error (F9), not a miss.
            try:
                torch.tpu.flush()
            except Exception as e:
                for r in rt[1]:
                    tpu.env.pop(r, None)
                rt, deferred = ("exc", type(e).__name__, str(e).split("\n")[0][:200]), True
        if rc[0] == "exc" or rt[0] == "exc":
            if rc[0] == "exc" and rt[0] == "exc":
                if rc[1] != rt[1]:
                    raise Failure(i, "exception", "cpu %s(%s) tpu %s(%s)" % (rc[1], rc[2], rt[1],
                                  rt[2]), op)
                if deferred:
                    raise Failure(i, "deferred", "cpu raised %s(%s) at the call, tpu at the "
                                  "next flush" % (rc[1], rc[2]), op)
                continue
            if rc[0] == "exc":
                raise Failure(i, "no_error", "cpu raised %s(%s), tpu did not" % (rc[1], rc[2]), op)
            raise Failure(i, "tpu_error", "tpu raised %s(%s)" % (rt[1], rt[2]), op)
        unstable = set(step.get("unstable", ()))
        for k, r in enumerate(rc[1]):
            if r not in tpu.env:
                raise Failure(i, "shape", "tpu returned fewer results", op, r)
            a, b = cpu.env[r], tpu.env[r]
            if a.dtype != b.dtype:
                raise Failure(i, "dtype", "cpu %s tpu %s" % (a.dtype, b.dtype), op, r)
            if a.shape != b.shape:
                raise Failure(i, "shape", "cpu %s tpu %s" % (tuple(a.shape), tuple(b.shape)),
                              op, r)
            if not step.get("nostride") and strides_differ(a, b):
                raise Failure(i, "stride", "cpu %s tpu %s" % (a.stride(), b.stride()), op, r)
            if not step.get("nostride") and a.numel() > 0 and \
                    a.storage_offset() != b.storage_offset():
                raise Failure(i, "stride", "storage_offset cpu %d tpu %d"
                              % (a.storage_offset(), b.storage_offset()), op, r)
            ac, at = aliases(cpu.env, r), aliases(tpu.env, r)
            if ac != at:
                raise Failure(i, "alias", "cpu shares storage with %s, tpu with %s"
                              % (sorted(ac), sorted(at)), op, r)
            if k in unstable:
                if every_step and not _unstable_ok(step, a, _host(b, i, op, r), cpu.env, k):
                    raise Failure(i, "value", "indices select different values", op, r)
                continue
            if every_step:
                d = values_differ(a, _host(b, i, op, r))
                if d:  # the dtype is part of the message (known.py entries may name it)
                    raise Failure(i, "value", "%s (%s)" % (d, str(a.dtype)[6:]), op, r)
        if every_step and _mutates(step) and step["in"]:
            bad = _compare_values(prog, i, sorted(aliases(cpu.env, step["in"][0]) |
                                                  {step["in"][0]}), cpu, tpu, op)
            if bad:
                raise Failure(i, "inplace", "var %s: %s" % bad, op, bad[0])
        if not every_step and rng.random() < 0.12:
            bad = _compare_values(prog, i, _stable_refs(steps, cpu.env), cpu, tpu, "checkpoint")
            if bad:
                raise Failure(i, "value", "checkpoint, var %s: %s" % bad, "checkpoint", bad[0])
    bad = _compare_values(prog, len(steps), _stable_refs(steps, cpu.env), cpu, tpu)
    if bad:
        raise Failure(len(steps) - 1, "value", "end, var %s: %s" % bad, "end", bad[0])
    if mode == "defer_and_fuse":
        torch.tpu.flush()
    return cpu, tpu


def _stable_refs(steps, env):
    out = []
    for r in env:
        i, _, k = r.partition(".")
        if k and int(k) in steps[int(i)].get("unstable", ()):
            continue
        out.append(r)
    return out


# ---------------------------------------------------------------- verdict

def _resync_matches(prog, mode, f: Failure) -> bool:
    """Whether step f.step matches CPU once its tpu inputs are overwritten with CPU's values.

    Called only when those inputs already differed (within tolerance) before the step: then a
    difference that vanishes on identical inputs is accumulated rounding amplified by the step
    (a floor, a comparison, a sort), not a wrong lowering."""
    i = f.step
    try:
        cpu, tpu = execute(prog, mode, every_step=False, stop_after=i - 1)
    except Failure:
        return False
    step = prog["steps"][i]
    ins = step["in"]
    if all(bitwise_equal(cpu.env[r], tpu.env[r].cpu()) for r in ins if r in cpu.env):
        return False
    for r in ins:
        try:
            with torch.no_grad():
                tpu.env[r].copy_(cpu.env[r])
        except Exception:
            tpu.env[r] = cpu.env[r].to(TPU)
    for r in ins:
        if not bitwise_equal(cpu.env[r], tpu.env[r].cpu()):
            tpu.env[r] = cpu.env[r].to(TPU)
    rc, rt = cpu.run_step(i, step), tpu.run_step(i, step)
    if rc is None or rt is None or rc[0] != rt[0]:
        return False
    if rc[0] == "exc":
        return rc[1] == rt[1]
    refs = list(rc[1]) + (list(ins[:1]) if _mutates(step) else [])
    unstable = set(step.get("unstable", ()))
    for k, r in enumerate(refs):
        if k in unstable and k < len(rc[1]):
            if not _unstable_ok(step, cpu.env[r], tpu.env[r], cpu.env, k):
                return False
        elif values_differ(cpu.env[r], tpu.env[r].cpu()):
            return False
    return True


def check(prog) -> dict:
    """Runs prog and classifies the outcome: ok | mismatch | error | drift | gap."""
    mode = prog["mode"]
    try:
        execute(prog, mode)
        return {"status": "ok"}
    except Failure as f:
        failure = f
    except Exception as e:  # raised outside a step: reading a tpu result back (.cpu())
        import traceback

        return {"status": "error", "kind": "readback", "op": "?", "step": -1,
                "detail": "%s: %s" % (type(e).__name__, str(e)[:300]),
                "trace": traceback.format_exc()[-1500:]}
    finally:
        try:
            torch.tpu.flush()
        except Exception:
            pass
    f = failure
    if f.op in ("end", "checkpoint"):
        # Localize: the same program with a comparison after every step.
        try:
            execute(prog, mode, every_step=True)
        except Failure as g:
            f = g
            f.detail += " (%s mode: first seen at a %s read)" % (mode, failure.op)
        except Exception:
            pass
    step = prog["steps"][f.step] if 0 <= f.step < len(prog["steps"]) else {}
    out = dict(f.as_dict(), status="mismatch")
    if f.kind in ("value", "inplace") and f.op not in ("end", "checkpoint") and _resync_matches(prog, mode, f):
        out["status"] = "drift"
    elif step.get("oor") and mode != "debug":
        out["status"] = "gap"
    elif f.kind == "tpu_error":
        out["status"] = "error"
    from .known import match

    k = match(f.op, f.kind, mode, f.detail)
    if out["status"] in ("mismatch", "error") and k:
        out["status"], out["known"] = "known", k["reason"]
    return out
