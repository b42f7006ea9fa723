"""Runs batches of programs per eager mode, in-process or in a worker subprocess (--isolate).

Outcomes per program: ok; mismatch (a wrong value, dtype, shape, stride, alias set, in-place
effect, or exception type; or CPU raised and tpu did not); error (tpu raised where CPU did not,
a read-back failed, or under --isolate the process crashed or hung); known (matches
known.KNOWN); gap (an out-of-range index outside debug mode, issue 12 item 1); drift (a
difference that disappears when the step's tpu inputs are reset to CPU's values: rounding
amplified by a discontinuous op; the program stops there).
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

from . import minimize as M
from . import program as P

MODES = ("strict", "debug", "defer_and_fuse")


def program_seed(seed: int, k: int) -> int:
    return seed * 1_000_003 + k


SHRINK = ("all", "new", "none")


def sig_key(status, result) -> tuple:
    """A failure's distinct signature: (status, kind, op, detail with numbers blanked)."""
    return (status, result.get("kind"), result.get("op"), _norm(result.get("detail", "")))


def run_one(mode, seed, k, min_ops=5, max_ops=50, shrink=True, shapes="free",
            seen=None) -> dict:
    """Generates, checks and (on failure) minimizes program k of run `seed` in `mode`.

    seen: a set of signatures (sig_key) already minimized; when given, only a failure with a
    new signature is minimized (and its signature added), the others are saved unminimized."""
    ps = program_seed(seed, k)
    t0 = time.monotonic()
    prog = P.generate(ps, mode, min_ops, max_ops, shapes)
    res = P.check(prog)
    rec = {"k": k, "seed": ps, "mode": mode, "status": res["status"], "result": res,
           "seconds": round(time.monotonic() - t0, 2)}
    if shapes != "free":
        rec["shapes"] = shapes
    if res["status"] in ("mismatch", "error", "gap"):
        key = sig_key(res["status"], res)
        rec["sig"] = list(key)
        if shrink and seen is not None:
            shrink = key not in seen
            seen.add(key)
    if res["status"] in ("mismatch", "error", "gap") and shrink:
        rec["shrunk"] = True
        small = M.minimize(prog, res)
        small_res = P.check(small)
        if M.signature(small_res) != M.signature(res):
            small, small_res = prog, res
        rec["ops"] = len(small["steps"])
        rec["program"] = small
        rec["snippet"] = M.snippet(small, small_res)
        rec["result"] = small_res
        rec["shrink_seconds"] = round(time.monotonic() - t0 - rec["seconds"], 2)
    return rec


class Summary:
    def __init__(self, mode, progress=0, log=print):
        self.mode, self.progress, self.log = mode, progress, log
        self.records: list = []
        self.counts = {s: 0 for s in ("ok", "mismatch", "error", "known", "gap", "drift")}
        self.t0, self.paused = time.monotonic(), 0.0  # paused: seconds spent in pause_wait

    @property
    def seconds(self) -> float:
        """Wall time of the run so far, pauses excluded."""
        return time.monotonic() - self.t0 - self.paused

    def add(self, rec):
        self.counts[rec["status"]] = self.counts.get(rec["status"], 0) + 1
        if self.progress and self.programs % self.progress == 0:
            self.log("progress " + self.line())
        if rec["status"] != "ok":
            self.records.append(rec)

    @property
    def programs(self):
        return sum(self.counts.values())

    def line(self) -> str:
        c = self.counts
        t = self.seconds
        return ("%s: %d programs, %d mismatches, %d errors (known %d, index gaps %d, drift stops %d)"
                "; %.0f s, %.2f programs/s"
                % (self.mode, self.programs, c["mismatch"], c["error"], c["known"], c["gap"],
                   c["drift"], t, self.programs / t if t > 0 else 0.0))


def pause_wait(pause_file, heartbeat=None, poll=5.0) -> float:
    """While `pause_file` exists, waits (calling heartbeat every `poll` s); returns the seconds
    waited. Checked between programs, so the program running when the file appears ends
    first."""
    if not pause_file or not os.path.exists(pause_file):
        return 0.0
    t0 = time.monotonic()
    while os.path.exists(pause_file):
        if heartbeat:
            heartbeat()
        time.sleep(poll)
    return time.monotonic() - t0


def load_seen(out) -> set:
    """Signatures of the failures already minimized in DIR/failures.jsonl (--shrink new)."""
    seen: set = set()
    path = os.path.join(out, "failures.jsonl") if out else None
    if path and os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line cut by a kill
                if rec.get("shrunk") and rec.get("sig"):
                    seen.add(tuple(rec["sig"]))
    return seen


def _save(out, rec):
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "failures.jsonl"), "a") as f:
            f.write(json.dumps(rec, default=str) + "\n")


def run_mode(mode, programs, seed, out=None, isolate=False, min_ops=5, max_ops=50,
             timeout=300.0, log=print, shrink=True, progress=0, crash_at=None, shapes="free",
             pause_file=None, until=None, first=0) -> Summary:
    """Programs k = first .. first + programs - 1 (a later run can go on where one stopped).
    shrink: True/"all" (minimize every failure), "new" (only the first failure of each
    signature not yet minimized in this run or in DIR/failures.jsonl), False/"none".
    until: a time.time() after which no new program starts."""
    shrink = {True: "all", False: "none"}.get(shrink, shrink)
    if shrink not in SHRINK:
        raise ValueError("shrink must be one of %s" % (SHRINK,))
    summary = Summary(mode, progress, log)
    crashes_shrunk = [0]

    def keep(rec):
        summary.add(rec)
        if rec["status"] != "ok":
            _report(rec, log)
            _save(out, rec)

    def worker_failure(k, kind, detail, shrink_it):
        """A program the worker died on (crash) or never finished (hang)."""
        rec = {"k": k, "seed": program_seed(seed, k), "mode": mode, "status": "error",
               "result": {"kind": kind, "op": "?", "detail": detail}}
        if shapes != "free":
            rec["shapes"] = shapes
        # Crashes come first: with --shrink new the first three of a run are minimized.
        shrink_it = shrink_it and (shrink == "all" or crashes_shrunk[0] < 3)
        crashes_shrunk[0] += bool(shrink_it)
        _crash_repro(rec, mode, min_ops, max_ops, shrink_it, shapes)
        keep(rec)

    seen = load_seen(out) if shrink == "new" else None
    end = first + programs
    if not isolate:
        for k in range(first, end):
            if until is not None and time.time() > until:
                break
            waited = pause_wait(pause_file)
            if waited:
                summary.paused += waited
                log("%s: paused %.1f s (%s)" % (mode, waited, pause_file))
            keep(run_one(mode, seed, k, min_ops, max_ops, shrink != "none", shapes, seen))
        return summary
    k = first
    while k < end and (until is None or time.time() <= until):
        cmd = [sys.executable, "-m", "torch_pjrt.fuzz", "--worker", "--mode", mode, "--seed",
               str(seed), "--start", str(k), "--programs", str(end), "--min-ops",
               str(min_ops), "--max-ops", str(max_ops), "--shrink", shrink,
               "--shapes", shapes] + \
            ([] if crash_at is None else ["--crash-at", str(crash_at)]) + \
            ([] if out is None else ["--out", out]) + \
            ([] if pause_file is None else ["--pause-file", pause_file]) + \
            ([] if until is None else ["--until", repr(until)])
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        current, deadline = None, time.monotonic() + timeout
        buf = ""
        while True:
            wait = deadline - time.monotonic()
            ready = select.select([proc.stdout], [], [], max(wait, 0))[0] if wait > 0 else []
            if not ready:
                proc.kill()
                proc.wait()
                worker_failure(current, "hang", "no answer within %.0f s" % timeout, False)
                k = current + 1
                break
            line = proc.stdout.readline()
            if not line:
                rc = proc.wait()
                if current is not None and rc != 0:
                    worker_failure(current, "crash", "worker exited with status %d" % rc,
                                   shrink != "none")
                    k = current + 1
                else:
                    k = end
                break
            buf = line.strip()
            if buf.startswith("PAUSE"):  # paused (a heartbeat) or resumed after N seconds
                deadline = time.monotonic() + timeout
                if buf.startswith("PAUSED "):
                    summary.paused += float(buf.split()[1])
                    log("%s: paused %s s (%s)" % (mode, buf.split()[1], pause_file))
                continue
            if buf.startswith("START "):
                current, deadline = int(buf.split()[1]), time.monotonic() + timeout
                continue
            if buf.startswith("{"):
                rec = json.loads(buf)
                keep(rec)
                current = None
                if rec["k"] == end - 1:
                    k = end
    return summary


def _crash_repro(rec, mode, min_ops, max_ops, shrink, shapes="free"):
    """The program of a crash or hang (generation is deterministic and runs on CPU only),
    minimized in fresh interpreters when `shrink`."""
    prog = P.generate(rec["seed"], mode, min_ops, max_ops, shapes)
    if shrink:
        rec["shrunk"] = True
        prog = M.minimize_crash(prog)
    rec["ops"] = len(prog["steps"])
    rec["program"] = prog
    rec["snippet"] = M.snippet(prog, None)


def worker(mode, seed, start, programs, min_ops, max_ops, shrink, crash_at=None,
           shapes="free", out=None, pause_file=None, until=None):
    """The --isolate child: announces each program before running it, then prints its record.
    While paused it prints PAUSE heartbeats, then PAUSED <seconds>."""
    shrink = {True: "all", False: "none"}.get(shrink, shrink)
    seen = load_seen(out) if shrink == "new" else None

    def beat():
        sys.stdout.write("PAUSE\n")
        sys.stdout.flush()
    for k in range(start, programs):
        waited = pause_wait(pause_file, beat)
        if waited:
            sys.stdout.write("PAUSED %.1f\n" % waited)
        if until is not None and time.time() > until:
            break
        sys.stdout.write("START %d\n" % k)
        sys.stdout.flush()
        if crash_at == k:  # a planted crash (tests of --isolate)
            os._exit(3)
        rec = run_one(mode, seed, k, min_ops, max_ops, shrink != "none", shapes, seen)
        sys.stdout.write(json.dumps(rec, default=str) + "\n")
        sys.stdout.flush()


def _report(rec, log):
    r = rec["result"]
    print_ = log
    print_("[%s] program %s (seed %s): %s %s at step %s op %s: %s" % (
        rec["mode"], rec["k"], rec["seed"], rec["status"], r.get("kind"), r.get("step"),
        r.get("op"), r.get("detail", "")[:160]))
    if rec.get("snippet") and rec["status"] in ("mismatch", "error"):
        log(rec["snippet"])


def _norm(detail: str) -> str:
    import re

    return re.sub(r"[-+]?\d[\d.e+-]*", "N", detail or "")[:90]


def report(paths) -> str:
    """Groups saved failures (failures.jsonl files) by (status, kind, op, detail with numbers
    blanked) and prints each group's smallest reproduction."""
    groups: dict = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                r = rec["result"]
                key = (rec["status"], r.get("kind"), r.get("op"), _norm(r.get("detail", "")))
                groups.setdefault(key, []).append(rec)
    out = []
    for key, recs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        modes = sorted({r["mode"] for r in recs})
        best = min(recs, key=lambda r: r.get("ops") or 1 << 30)
        out.append("## %s %s %s x%d (%s)\n%s\nseed %s, %s ops\n%s" % (
            key[0], key[1], key[2], len(recs), ", ".join(modes), key[3], best["seed"],
            best.get("ops"), best.get("snippet", "")))
    return "\n".join(out)
