"""Delta debugging of a failing program, and its reproduction as a standalone snippet.

A candidate keeps a subset of the steps; dropped steps become no-ops *in place* so that var refs
(step indices) stay valid, and any step reading a dropped var is skipped on both sides. A
candidate is kept when it still fails with the same signature (status, kind, op). Then input
shapes shrink (each dim to 1, then halved) and layouts become contiguous while it still fails.
"""
from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import tempfile
import time

from . import program as P

_NOP = {"op": "nop", "in": ["<dropped>"], "expr": "None"}


def signature(result) -> tuple:
    return (result.get("status"), result.get("kind"), result.get("op"))


def _with(prog, steps):
    return dict(prog, steps=steps)


def _budgeted(test, max_checks, max_seconds):
    """`test` (steps -> still fails?) limited to max_checks calls and max_seconds from now; past
    either it answers False, so the search keeps what it has."""
    t0 = time.monotonic()
    checks = [0]

    def fails(steps) -> bool:
        if checks[0] >= max_checks or time.monotonic() - t0 > max_seconds:
            return False
        checks[0] += 1
        return test(steps)
    return fails


def minimize(prog, result, max_checks=200, max_seconds=60.0) -> dict:
    """The smallest program found that fails like `result`; prog itself when none is smaller."""
    want = signature(result)

    def same_failure(steps) -> bool:
        try:
            return signature(P.check(_with(prog, steps))) == want
        except Exception:
            return False
    fails = _budgeted(same_failure, max_checks, max_seconds)

    steps = list(prog["steps"])
    if result.get("op") != "end" and 0 <= result.get("step", -1) < len(steps):
        cut = steps[: result["step"] + 1]
        if fails(cut):
            steps = cut
    steps = _ddmin(steps, fails)
    # Cut dependencies: a step whose result feeds the failure becomes a fresh input of the same
    # shape and dtype when the failure stays; what only fed it is then dropped.
    cpu = P.Side("cpu")
    for i, s in enumerate(steps):
        if s is not _NOP:
            cpu.run_step(i, s)
    cut_any = False
    for i in reversed(range(len(steps))):
        s = steps[i]
        if s is _NOP or s["op"] == "input" or s.get("tuple") or str(i) not in cpu.env:
            continue
        t = cpu.env[str(i)]
        cand = list(steps)
        cand[i] = {"op": "input", "kw": {"shape": list(t.shape), "dtype": O_dt(t),
                                         "layout": "contig", "seed": i}}
        if fails(cand):
            steps, cut_any = cand, True
    if cut_any:
        steps = _ddmin(steps, fails)
    # Shapes and layouts of the inputs: each change is kept while the failure stays.
    for i in [i for i, s in enumerate(steps) if s.get("op") == "input"]:
        changed = True
        while changed:
            changed = False
            for v in _smaller(steps[i]["kw"]):
                cand = list(steps)
                cand[i] = dict(steps[i], kw=v)
                if fails(cand):
                    steps, changed = cand, True
                    break
    return compact(_with(prog, steps))


def crashes(prog, timeout=120.0):
    """(whether running prog kills a fresh interpreter or hangs it, the last step it began)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prog, f)
    try:
        r = subprocess.run([sys.executable, "-m", "torch_pjrt.fuzz", "--replay", f.name],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                           timeout=timeout)
        out, died = r.stdout, r.returncode < 0 or r.returncode > 1
    except subprocess.TimeoutExpired as e:
        out, died = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), True
    finally:
        os.unlink(f.name)
    steps = [int(line.split()[1]) for line in out.splitlines() if line.startswith("STEP ")]
    return died, (steps[-1] if steps else -1)


def minimize_crash(prog, max_checks=30, max_seconds=240.0, timeout=120.0) -> dict:
    """Delta debugging for a crash or hang: each candidate runs in its own interpreter. The
    program is first cut after the step it died in."""
    fails = _budgeted(lambda steps: crashes(_with(prog, steps), timeout)[0], max_checks,
                      max_seconds)

    steps = list(prog["steps"])
    died, last = crashes(prog, timeout)
    if died and 0 <= last < len(steps) - 1 and fails(steps[: last + 1]):
        steps = steps[: last + 1]
    return compact(_with(prog, _ddmin(steps, fails)))


def O_dt(t) -> str:
    return str(t.dtype).replace("torch.", "")


def _ddmin(steps, fails):
    """Drops chunks of steps (halving the chunk size) while the program still fails."""
    live = [i for i, s in enumerate(steps) if s is not _NOP]
    chunk = max(len(live) // 2, 1)
    while chunk >= 1:
        removed_any = False
        live = [i for i, s in enumerate(steps) if s is not _NOP]
        for start in range(0, len(live), chunk):
            part = set(live[start:start + chunk])
            cand = [(_NOP if i in part else s) for i, s in enumerate(steps)]
            if any(s is not _NOP for s in cand) and fails(cand):
                steps, removed_any = cand, True
        if not removed_any:
            if chunk == 1:
                break
            chunk //= 2
    return steps


def _smaller(kw):
    if kw["layout"] != "contig":
        yield dict(kw, layout="contig")
    for d, n in enumerate(kw["shape"]):
        for m in sorted({1, n // 2}):
            if 0 < m < n:
                shape = list(kw["shape"])
                shape[d] = m
                yield dict(kw, shape=shape)


def compact(prog) -> dict:
    """Drops no-op steps and renumbers refs."""
    mapping, out = {}, []
    for i, s in enumerate(prog["steps"]):
        if s is _NOP or s.get("op") == "nop":
            continue
        s = dict(s)
        if "in" in s:
            if any(r not in mapping and r.split(".")[0] not in mapping for r in s["in"]):
                continue  # reads a dropped var: it was skipped anyway
            s["in"] = [mapping.get(r) or (mapping[r.split(".")[0]] + "." + r.split(".")[1])
                       for r in s["in"]]
        mapping[str(i)] = str(len(out))
        out.append(s)
    return dict(prog, steps=out)


def _var(ref: str) -> str:
    return "v" + ref.replace(".", "_")


def snippet(prog, result=None) -> str:
    """A standalone Python reproduction: runs the program on cpu and tpu and compares."""
    lines = [
        "import torch",
        "import torch_pjrt  # registers the tpu device",
        "",
        "torch.tpu.set_eager_mode(%r)" % prog["mode"],
        "",
        inspect.getsource(P.make_input).rstrip(),
        "",
        "",
        "def run(dev):",
        "    def T(values, dtype):",
        "        return torch.tensor(values, dtype=getattr(torch, dtype), device=dev)",
        "",
        "    def S(x, key, value):",
        "        x[key] = value",
        "        return x",
        "",
    ]
    fail_step = (result or {}).get("step", -1)
    for i, s in enumerate(prog["steps"]):
        if s["op"] == "input":
            lines.append("    %s = make_input(%r, dev)" % (_var(str(i)), s["kw"]))
            continue
        expr = s["expr"].format(*[_var(r) for r in s["in"]])
        target = _var(str(i))
        body = "%s = %s" % (target, expr)
        if s.get("tuple"):
            body = "%s = tuple(%s)" % (target, expr)
        if i == fail_step and (result or {}).get("kind") in ("exception", "no_error",
                                                              "tpu_error"):
            lines += ["    try:", "        " + body, "    except Exception as e:",
                      "        print(dev, 'raised', type(e).__name__, e)",
                      "        %s = None" % target]
        else:
            lines.append("    " + body + "  # " + s["op"])
    lines += ["    return locals()", "", "", "cpu, tpu = run('cpu'), run('tpu')"]
    if result and result.get("ref"):
        r = result["ref"]
        v = _var(r)
        if "." in r:
            v = "%s[%s]" % (_var(r.split(".")[0]), r.split(".")[1])
        lines += ["a, b = cpu[%r], tpu[%r]" % (v.split("[")[0], v.split("[")[0])]
        if "[" in v:
            k = int(v.split("[")[1].rstrip("]"))
            lines += ["a, b = a[%d], b[%d]" % (k, k)]
        lines += ["print('cpu', a.dtype, tuple(a.shape), a.stride(), a)",
                  "print('tpu', b.dtype, tuple(b.shape), b.stride(), b.cpu())"]
    if result:
        lines.append("# expected: %s %s at step %s (%s)" % (result.get("kind"), result.get("op"),
                     result.get("step"), result.get("detail", "")[:120]))
    return "\n".join(lines) + "\n"
