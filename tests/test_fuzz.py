"""The differential fuzzer (torch_pjrt/fuzz): a fixed-seed slice per eager mode must show no
mismatch outside torch_pjrt/fuzz/known.py, a planted bug must be caught and minimized, and
--isolate must survive a crashing worker."""
from __future__ import annotations

import pytest
import torch

from torch_pjrt.fuzz import known, minimize, ops, program, runner

# The slice CI runs: small programs so that each mode stays within a few seconds of compiling
# on this 2-core machine (docs/reliability.md has the long runs).
SLICE_PROGRAMS = 16
SLICE_OPS = (5, 14)


@pytest.mark.parametrize("mode", runner.MODES)
def test_fixed_seed_slice(mode):
    s = runner.run_mode(mode, SLICE_PROGRAMS, seed=7, min_ops=SLICE_OPS[0],
                        max_ops=SLICE_OPS[1], shrink=False, log=lambda *_: None)
    assert s.programs == SLICE_PROGRAMS
    bad = [(r["seed"], r["result"]) for r in s.records if r["status"] in ("mismatch", "error")]
    assert not bad, s.line() + "\n" + "\n".join(map(str, bad))
    # Every known entry that fired names its reason.
    for r in s.records:
        if r["status"] == "known":
            assert r["result"]["known"]


_LIB = None


def _planted_op():
    """fuzz_planted::twice: 2*x on CPU, 2*x + 1 on tpu (the planted bug)."""
    global _LIB
    if _LIB is None:
        _LIB = torch.library.Library("fuzz_planted", "DEF")
        _LIB.define("twice(Tensor x) -> Tensor")
        _LIB.impl("twice", lambda x: x * 2, "CPU")
        _LIB.impl("twice", lambda x: x * 2 + 1, "PrivateUse1")


def _gen_planted(c):
    r = c.pick(lambda t: t.dtype.is_floating_point)
    return None if r is None else {"op": "planted", "in": [r],
                                   "expr": "torch.ops.fuzz_planted.twice({0})"}


def test_planted_bug_is_caught_and_minimized(monkeypatch):
    _planted_op()
    table = dict(ops.TABLE)
    table["planted"] = (_gen_planted, 0.4)
    monkeypatch.setattr(ops, "TABLE", table)
    found = None
    for seed in range(40):
        prog = program.generate(seed, "strict", 10, 20)
        if not any(s["op"] == "planted" for s in prog["steps"]):
            continue
        res = program.check(prog)
        if res["status"] == "mismatch" and res["op"] == "planted":
            found = (prog, res)
            break
    assert found, "the planted bug (tpu adds 1) went unnoticed"
    prog, res = found
    assert res["kind"] in ("value", "inplace")
    small = minimize.minimize(prog, res)
    small_res = program.check(small)
    assert minimize.signature(small_res) == minimize.signature(res)
    assert len(small["steps"]) < len(prog["steps"])
    # The planted op and what feeds it: one input (perhaps a view of it) and the op.
    assert len(small["steps"]) <= 3, small["steps"]
    for s in small["steps"]:
        if s["op"] == "input":
            assert all(d <= 1 for d in s["kw"]["shape"]), s  # shapes shrank too
    text = minimize.snippet(small, small_res)
    assert "torch.ops.fuzz_planted.twice" in text
    out = {}
    exec(compile(text, "<snippet>", "exec"), out)  # the reproduction runs standalone
    assert not torch.equal(out["cpu"][_last(small)], out["tpu"][_last(small)].cpu())


def _last(prog):
    return "v%d" % (len(prog["steps"]) - 1)


def test_isolate_records_a_crash_and_goes_on():
    s = runner.run_mode("strict", 3, seed=3, isolate=True, min_ops=2, max_ops=3, shrink=False,
                        timeout=120, log=lambda *_: None, crash_at=1)
    assert s.programs == 3
    crashes = [r for r in s.records if r["result"].get("kind") == "crash"]
    assert [r["k"] for r in crashes] == [1]
    assert crashes[0]["seed"] == runner.program_seed(3, 1)


def test_comparison_catches_value_dtype_nan_and_alias_differences():
    a = torch.tensor([1.0, float("nan"), 3.0])
    assert program.values_differ(a, a.clone()) is None
    assert program.values_differ(a, torch.tensor([1.0, 2.0, 3.0])) is not None  # NaN position
    assert program.values_differ(a, torch.tensor([1.0, float("nan"), 3.01])) is not None
    env = {"0": torch.zeros(4)}
    env["1"] = env["0"][1:]
    env["2"] = env["0"].clone()
    assert program.aliases(env, "1") == {"0"} and program.aliases(env, "2") == set()
    assert known.match("no_such_op", "value", "strict") is None


def test_vocab_shapes_slice():
    """--shapes vocab (the big runs' default): first inputs come from the vocabulary, and a
    fixed-seed slice shows no mismatch outside known.py."""
    for seed in range(30):
        prog = program.generate(seed, "strict", 5, 14, shapes="vocab")
        assert prog["shapes"] == "vocab"
        first = prog["steps"][0]
        assert first["op"] == "input"
        assert first["kw"]["shape"] in program.VOCAB[len(first["kw"]["shape"])]
    s = runner.run_mode("strict", 8, seed=7, min_ops=SLICE_OPS[0], max_ops=SLICE_OPS[1],
                        shrink=False, shapes="vocab", log=lambda *_: None)
    assert s.programs == 8
    bad = [(r["seed"], r["result"]) for r in s.records if r["status"] in ("mismatch", "error")]
    assert not bad, s.line() + "\n" + "\n".join(map(str, bad))


def test_shrink_new_minimizes_each_signature_once(monkeypatch, tmp_path):
    _planted_op()

    def planted_program(ps, mode, *args, **kw):
        return {"seed": ps, "mode": mode, "steps": [
            {"op": "input", "kw": {"shape": [3], "dtype": "float32", "layout": "contig",
                                   "seed": ps}},
            {"op": "abs", "in": ["0"], "expr": "torch.abs({0})"},
            {"op": "planted", "in": ["1"], "expr": "torch.ops.fuzz_planted.twice({0})"}]}
    monkeypatch.setattr(program, "generate", planted_program)
    seen = set()
    first, second = (runner.run_one("strict", 0, k, shrink=True, seen=seen) for k in (0, 1))
    assert first["status"] == second["status"] == "mismatch"
    assert first["sig"] == second["sig"]
    assert first.get("shrunk") and len(first["program"]["steps"]) == 2  # abs dropped
    assert not second.get("shrunk") and "program" not in second
    # A later run reads the minimized signatures back from DIR/failures.jsonl.
    runner._save(str(tmp_path), first)
    runner._save(str(tmp_path), second)
    assert runner.load_seen(str(tmp_path)) == {tuple(first["sig"])}


def test_pause_file_waits_until_it_is_gone(tmp_path):
    import threading

    f = tmp_path / "PAUSE"
    assert runner.pause_wait(str(f)) == 0.0
    f.write_text("")
    beats = []
    threading.Timer(0.3, f.unlink).start()
    waited = runner.pause_wait(str(f), lambda: beats.append(1), poll=0.05)
    assert waited >= 0.25 and beats


def test_defer_and_fuse_error_raised_at_the_next_flush_is_a_deferred_verdict():
    """A lowering's check (argmin of bool) raises in DeferAndFuse at the flush the runner makes
    after a step CPU raised on: a 'deferred' failure (known, F9), not a missed error."""
    steps = [{"op": "input", "kw": {"shape": [3], "dtype": "bool", "layout": "contig",
                                    "seed": 1}},
             {"op": "argmin", "in": ["0"], "expr": "torch.argmin({0})"}]
    res = program.check({"seed": 1, "mode": "defer_and_fuse", "steps": steps})
    assert (res["status"], res["kind"], res["op"]) == ("known", "deferred", "argmin"), res
    res = program.check({"seed": 1, "mode": "strict", "steps": steps})
    assert res["status"] == "ok", res
