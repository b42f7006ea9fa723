"""Runs PyTorch's own device-generic test files against the ``tpu`` device, with the CPU
classes as the control, and reports how many of the tests that pass on CPU pass on ``tpu``.

    python -m torch_pjrt.testing.upstream [FILES] [-k EXPR] [--fraction F --seed S]
        [--fallback-too] [--markdown docs/upstream-tests.md] [--json out.json]
        [--check-against BASELINE.json]

FILES are names (``test_view_ops``), file names or paths; by default every ``test_*.py`` of
``../shared/upstream-tests/`` (beside the repository; ``TORCH_PJRT_UPSTREAM_DIR`` overrides).

How it runs: for each file and each device type, one pytest child process
(``PYTORCH_TESTING_DEVICE_ONLY_FOR=cpu`` or ``privateuse1``) with the plugin
``torch_pjrt.testing._upstream_plugin``. The ``tpu`` child runs with
``TORCH_PJRT_CPU_FALLBACK=0``: a test that passes only by running an op on the CPU counts as
failed; ``--fallback-too`` adds a second ``tpu`` run with the fallback on, reported apart. A child
that crashes or hangs (a per-test watchdog ends it) is restarted after the test that did it; that
test is recorded as ``crashed`` or ``hung`` and the file is marked as having crashed (the issue
counts a crash as a failure of the whole file). Tests are paired across devices by their id with
the device taken out (``upstream_ids``).
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from torch_pjrt.testing import upstream_compat, upstream_exclusions, upstream_ids

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEVICES = ("cpu", "tpu")
MAX_RESTARTS = 50

# Named selections (``--suite``): files with their sample fractions, sized by the time a test
# takes on `tpu` here (1-4 s with a cold cache: most tests compile programs at new shapes).
SUITES = {
    # scripts/test.sh (CI): the subset that fits CI's budget (about 350 tests, 15 minutes cold),
    # checked against tests/upstream_baseline.json. A sample at fraction f is a subset of the
    # same file's sample at any larger fraction (same seed), so a "docs" run gives CI's counts.
    "ci": ["test_view_ops@0.5", "test_indexing", "test_torch@0.08", "test_binary_ufuncs@0.004"],
    # scripts/test.sh --upstream: every file (samples of 40-250 tests of the largest ones, where
    # a test on tpu takes 1-4 s cold, nearly all of it compiling); writes
    # docs/upstream-tests.md.
    "docs": ["test_view_ops", "test_indexing", "test_tensor_creation_ops@0.3",
             "test_torch@0.15", "test_foreach@0.03", "test_nn@0.03", "test_modules@0.03",
             "test_reductions@0.03", "test_binary_ufuncs@0.01",
             "test_unary_ufuncs@0.004", "test_ops@0.003"],
}


# Tests a suite leaves out on both devices for their time alone (they pass or fail in "docs"
# runs, which report them like any other): {suite: {file: {normalized id: reason}}}.
SUITE_LEAVES_OUT = {
    "ci": {
        "test_torch.py": {
            "TestTorchDeviceTypeDEV::test_gather_backward_deterministic_path_dev":
                "compiles a program per size of a loop: over the 300 s watchdog with a cold cache",
        },
    },
}


def default_dir() -> str:
    """``TORCH_PJRT_UPSTREAM_DIR``, else ``shared/upstream-tests`` beside the checkout, else
    the workplace's ``/work/shared/upstream-tests`` (a fresh clone may live elsewhere)."""
    env = os.environ.get("TORCH_PJRT_UPSTREAM_DIR")
    if env:
        return env
    beside = os.path.join(os.path.dirname(REPO), "shared", "upstream-tests")
    if os.path.isdir(beside):
        return beside
    return "/work/shared/upstream-tests"


def resolve_files(names, base, fraction):
    """[(path, fraction)]: a name may carry its own sample fraction as ``name@0.1``."""
    if not names:
        return sorted((os.path.join(base, f), fraction) for f in os.listdir(base)
                      if f.startswith("test_") and f.endswith(".py"))
    out = []
    for name in names:
        name, _, frac = name.partition("@")
        frac = float(frac) if frac else fraction
        if os.path.exists(name):
            out.append((os.path.abspath(name), frac))
            continue
        fname = name if name.endswith(".py") else name + ".py"
        path = os.path.join(base, fname)
        if not os.path.exists(path):
            raise SystemExit(f"upstream test file not found: {name} (looked in {base})")
        out.append((path, frac))
    return out


def _child_env(device, results, done, args, fallback, fraction):
    env = dict(os.environ)
    env["PYTORCH_TESTING_DEVICE_ONLY_FOR"] = "cpu" if device == "cpu" else "privateuse1"
    env["TORCH_PJRT_UPSTREAM_DEVICE"] = "cpu" if device == "cpu" else "privateuse1"
    env["TORCH_PJRT_UPSTREAM_RESULTS"] = results
    env["TORCH_PJRT_UPSTREAM_DONE"] = done
    env["TORCH_PJRT_UPSTREAM_FRACTION"] = str(fraction)
    env["TORCH_PJRT_UPSTREAM_SEED"] = str(args.seed)
    env["TORCH_PJRT_UPSTREAM_TIMEOUT"] = str(args.timeout)
    env["TORCH_PJRT_CPU_FALLBACK"] = "1" if fallback else "0"
    # The repository first on the path, so the children import this checkout's torch_pjrt.
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    if args.cache_dir:
        env["TORCH_PJRT_CACHE_DIR"] = args.cache_dir
    return env


def run_one(path, device, args, workdir, fallback=False, fraction=1.0):
    """Runs one file on one device type; returns {"tests": {id: record}, "seconds": wall,
    "crashes": [...], "restarts": n, "tail": the last child's output tail}."""
    tag = f"{os.path.basename(path)[:-3]}.{device}{'.fallback' if fallback else ''}"
    results = os.path.join(workdir, tag + ".jsonl")
    done = os.path.join(workdir, tag + ".done")
    open(results, "w").close()
    left_out = list(getattr(args, "leave_out", {}).get(os.path.basename(path), {}))
    with open(done, "w") as f:  # ids left out from the start (SUITE_LEAVES_OUT)
        f.write("".join(i + "\n" for i in left_out))
    ini = os.path.join(workdir, "pytest.ini")
    if not os.path.exists(ini):
        with open(ini, "w") as f:
            f.write("[pytest]\n")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
           "torch_pjrt.testing._upstream_plugin", "-c", ini, "--rootdir", workdir,
           "-o", "console_output_style=classic",
           path]
    if args.k:
        cmd[-1:-1] = ["-k", args.k]
    tests, crashes, restarts, tail = {}, [], 0, ""
    t0 = time.perf_counter()
    seen_lines = 0
    while True:
        env = _child_env(device, results, done, args, fallback, fraction)
        proc = subprocess.run(cmd, env=env, cwd=workdir, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, errors="replace")
        tail = proc.stdout[-4000:]
        with open(results) as f:
            lines = f.readlines()
        started = None
        for line in lines[seen_lines:]:
            rec = json.loads(line)
            if rec["event"] == "start":
                started = rec["id"]
            elif rec["event"] == "end":
                tests[rec["id"]] = rec
                started = None
        seen_lines = len(lines)
        if started is None:
            if proc.returncode not in (0, 1, 5) and not tests:
                crashes.append({"id": "<collection>", "rc": proc.returncode,
                                "message": _last_error(proc.stdout)})
            elif proc.returncode not in (0, 1, 5):
                crashes.append({"id": "<between tests>", "rc": proc.returncode,
                                "message": _last_error(proc.stdout)})
            break
        # The child died inside `started`: a crash, or the watchdog ended a hang.
        hung = os.path.exists(results + ".hung") and os.path.getsize(results + ".hung") > 0
        kind = "hung" if hung else "crashed"
        msg = (f"hung: no result after {args.timeout:g} s" if hung
               else f"process died (exit {proc.returncode}): {_last_error(proc.stdout)}")
        tests[started] = {"id": started, "outcome": kind, "message": msg, "seconds": None}
        crashes.append({"id": started, "rc": proc.returncode, "message": msg})
        with open(done, "w") as f:  # a restart runs only what has no result yet
            f.write("".join(i + "\n" for i in left_out + list(tests)))
        if os.path.exists(results + ".hung"):
            os.remove(results + ".hung")
        restarts += 1
        if restarts > MAX_RESTARTS:
            crashes.append({"id": "<gave up>", "rc": proc.returncode,
                            "message": f"more than {MAX_RESTARTS} restarts"})
            break
    for leftover in (results, done, results + ".hung"):
        if os.path.exists(leftover):
            os.remove(leftover)
    return {"tests": tests, "seconds": round(time.perf_counter() - t0, 2), "crashes": crashes,
            "restarts": restarts, "tail": tail}


def _last_error(out: str) -> str:
    lines = [ln for ln in out.splitlines() if ln.strip()]
    # a fatal signal: faulthandler's report names it and the crashing thread's innermost frames
    fatal = [i for i, ln in enumerate(lines) if "Fatal Python error" in ln]
    if fatal:
        i = fatal[-1]
        frames = [ln.strip() for ln in lines[i + 1:i + 40] if ln.strip().startswith("File ")]
        head = lines[i][lines[i].index("Fatal Python error"):].strip()
        return (head + "; innermost: " + " <- ".join(frames[:4]))[:600]
    for ln in reversed(lines):
        if re.match(r"^(E\s+)?\w*(Error|Exception|Fatal|Abort|Segmentation)", ln.strip()):
            return ln.strip()[:300]
    return lines[-1][:300] if lines else ""


def _counts(tests):
    c = collections.Counter(r["outcome"] for r in tests.values())
    return {k: c.get(k, 0) for k in ("passed", "failed", "error", "skipped", "crashed", "hung")}


_NUM = re.compile(r"\d+(\.\d+)?")


def root_cause(message: str) -> str:
    """Groups failures: the exception line with every digit run blurred to N (sizes, shapes,
    values, dtype widths: complex64 and complex128 fail for one cause), cut to 160 chars."""
    first = (message or "").strip().splitlines()[0] if (message or "").strip() else "(no message)"
    first = _NUM.sub("N", first)
    first = re.sub(r"0x[0-9a-f]+", "0x..", first)
    return first[:160]


def compare(cpu, tpu):
    """The headline for one file: of the tests that pass on CPU, how many have a `tpu` twin that
    ran and how many of those pass; failures of those twins grouped by root cause."""
    cpu_pass = {i for i, r in cpu["tests"].items() if r["outcome"] == "passed"}
    twins = {i: tpu["tests"][i] for i in cpu_pass if i in tpu["tests"]}
    ran = {i: r for i, r in twins.items() if r["outcome"] != "skipped"}
    passed = sorted(i for i, r in ran.items() if r["outcome"] == "passed")
    failing = {i: r for i, r in ran.items() if r["outcome"] != "passed"}
    groups = collections.defaultdict(list)
    for i, r in failing.items():
        groups[(r["outcome"], root_cause(r["message"]))].append(i)
    missing = sorted(cpu_pass - set(tpu["tests"]))
    excluded = []
    for i in missing:
        cls = upstream_ids.generic_class(i)
        name = _generic_test_name(i)
        why = upstream_exclusions.reason(cls, name)
        if why:
            excluded.append((i, why))
    return {
        "cpu_passed": len(cpu_pass),
        "twins_ran": len(ran),
        "twins_passed": len(passed),
        "twins_skipped": len(twins) - len(ran),
        "not_instantiated": len(missing) - len(excluded),
        "excluded": len(excluded),
        "share": (len(passed) / len(ran)) if ran else None,
        "groups": sorted(([k[0], k[1], sorted(v)] for k, v in groups.items()),
                         key=lambda g: (-len(g[2]), g[1])),
        "failing": sorted(failing),
    }


def _generic_test_name(normalized_id):
    test = normalized_id.split("::")[-1]
    return test.split("_dev")[0] if "_dev" in test else test


def run(args):
    if not os.path.isdir(args.dir):
        raise SystemExit(f"no upstream test folder at {args.dir} (set TORCH_PJRT_UPSTREAM_DIR)")
    names = list(args.files) + (SUITES[args.suite] if args.suite else [])
    args.leave_out = SUITE_LEAVES_OUT.get(args.suite, {}) if args.suite else {}
    files = resolve_files(names, args.dir, args.fraction)
    workdir = tempfile.mkdtemp(prefix="torch_pjrt_upstream_")
    report = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv),
              "torch": _torch_version(), "fraction": args.fraction, "seed": args.seed,
              "k": args.k, "adaptations": upstream_compat.describe(),
              "cache_dir": args.cache_dir, "left_out": args.leave_out, "files": {}}
    for path, fraction in files:
        name = os.path.basename(path)
        entry = {}
        for device in args.devices:
            res = run_one(path, device, args, workdir, fraction=fraction)
            entry[device] = res
            _progress(name, device, res)
        if args.fallback_too and "tpu" in args.devices:
            res = run_one(path, "tpu", args, workdir, fallback=True, fraction=fraction)
            entry["tpu_fallback"] = res
            _progress(name, "tpu+fallback", res)
        summary = {"fraction": fraction, "wall_s": {d: entry[d]["seconds"] for d in entry},
                   "compile": {d: _compile_totals(entry[d]["tests"]) for d in entry
                               if d != "cpu"},
                   "counts": {d: _counts(entry[d]["tests"]) for d in entry},
                   "crashes": {d: entry[d]["crashes"] for d in entry if entry[d]["crashes"]}}
        if "cpu" in entry and "tpu" in entry:
            summary["compare"] = compare(entry["cpu"], entry["tpu"])
            if "tpu_fallback" in entry:
                summary["compare_fallback"] = compare(entry["cpu"], entry["tpu_fallback"])
        summary["tests"] = {d: entry[d]["tests"] for d in entry} if args.json else None
        report["files"][name] = summary
        if args.json:  # written after every file, so a long run leaves partial results
            _write_json(report, args.json)
    shutil.rmtree(workdir, ignore_errors=True)
    return report


def _compile_totals(tests):
    """Programs compiled and seconds spent compiling over a run's tests (tpu runs)."""
    recs = [r for r in tests.values() if "compiles" in r]
    return {"compiles": sum(r["compiles"] for r in recs),
            "compile_s": round(sum(r["compile_s"] for r in recs), 1),
            "test_s": round(sum(r["seconds"] or 0 for r in recs), 1)}


def _torch_version():
    import importlib.metadata as md

    try:
        return md.version("torch")
    except md.PackageNotFoundError:
        return "?"


def _write_json(report, path):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _progress(name, device, res):
    c = _counts(res["tests"])
    extra = f", {len(res['crashes'])} crash(es)" if res["crashes"] else ""
    print(f"[upstream] {name} {device}: {c['passed']} passed, {c['failed']} failed, "
          f"{c['error']} errors, {c['skipped']} skipped{extra} in {res['seconds']:.1f} s",
          flush=True)


def _pct(x):
    return "-" if x is None else f"{100 * x:.1f}%"


def markdown(report) -> str:
    out = ["# PyTorch's own tests on `tpu`", "",
           f"Generated by `torch_pjrt.testing.upstream` on {report['date']} (torch "
           f"{report['torch']}).", "", "Command:", "", "```", report["command"], "```", ""]
    sampled = {n: s["fraction"] for n, s in report["files"].items() if s["fraction"] < 1}
    if sampled:
        out += ["Seeded samples (seed " + str(report["seed"]) + "; the same tests on both "
                "devices): " + ", ".join(f"{n} {f:g}" for n, f in sampled.items()) + ".", ""]
    out += ["Headline: **of the tests that pass on CPU, the share whose `tpu` twin passes** (CPU "
            "fallback off). A twin skipped on `tpu` is left out of the share and counted apart.",
            "", "| file | CPU passed | tpu twins ran | tpu passed | share | with fallback | "
            "tpu skipped | excluded | not instantiated | crashes | CPU s | tpu s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    total = collections.Counter()
    for name, s in report["files"].items():
        c = s.get("compare")
        if not c:
            out.append(f"| {name} | (one device only) |||||||||||")
            continue
        cf = s.get("compare_fallback")
        n_crash = sum(len(v) for v in s["crashes"].values())
        out.append(
            f"| {name} | {c['cpu_passed']} | {c['twins_ran']} | {c['twins_passed']} | "
            f"{_pct(c['share'])} | {_pct(cf['share']) if cf else '-'} | {c['twins_skipped']} | "
            f"{c['excluded']} | {c['not_instantiated']} | {n_crash} | "
            f"{s['wall_s'].get('cpu', 0):.0f} | {s['wall_s'].get('tpu', 0):.0f} |")
        for k in ("cpu_passed", "twins_ran", "twins_passed"):
            total[k] += c[k]
    if total["twins_ran"]:
        out.append(f"| **all** | {total['cpu_passed']} | {total['twins_ran']} | "
                   f"{total['twins_passed']} | "
                   f"**{_pct(total['twins_passed'] / total['twins_ran'])}** ||||||||")
    out += ["", "## Time", "",
            "Wall time of each child process (collection included; restarts after a crash or "
            "hang included), and what the `tpu` tests spent compiling programs (the runtime's "
            "own counters, summed over tests; Strict mode compiles on background threads "
            "while tests run, so the compile seconds can exceed the tests' own). Persistent "
            "compile cache: "
            + (f"`{report['cache_dir']}`" if report.get("cache_dir") else "the default one")
            + ".", "",
            "| file | CPU s | tpu s | tpu / CPU | programs compiled | compiling s | share of "
            "tpu test time |", "|---|---|---|---|---|---|---|"]
    for name, s in report["files"].items():
        w = s["wall_s"]
        comp = s.get("compile", {}).get("tpu")
        if "cpu" not in w or "tpu" not in w or not comp:
            continue
        share = comp["compile_s"] / comp["test_s"] if comp["test_s"] else 0
        out.append(f"| {name} | {w['cpu']:.0f} | {w['tpu']:.0f} | "
                   f"{w['tpu'] / max(w['cpu'], 1e-9):.1f}x | {comp['compiles']} | "
                   f"{comp['compile_s']:.0f} | {100 * share:.0f}% |")
    out += ["", "## Failures by root cause", ""]
    for name, s in report["files"].items():
        c = s.get("compare")
        if not c or not c["groups"]:
            continue
        out += [f"### {name}", "", "| count | outcome | first line | examples |",
                "|---|---|---|---|"]
        for outcome, cause, ids in c["groups"]:
            ex = ", ".join(f"`{i.split('::')[-1]}`" for i in ids[:2])
            cause_md = cause.replace("|", "\\|").replace("`", "'")
            out.append(f"| {len(ids)} | {outcome} | {cause_md} | {ex} |")
        known = [(i.split("::")[-1], upstream_exclusions.KNOWN_FAILURE_CAUSES.get(
            i.split("::")[-1])) for _, _, ids in c["groups"] for i in ids]
        known = [(n, why) for n, why in known if why]
        if known:
            out += ["", "Known causes:", ""] + [f"- `{n}`: {why}" for n, why in known]
        out.append("")
    crashes = [(n, d, c) for n, s in report["files"].items() for d, cs in s["crashes"].items()
               for c in cs]
    if crashes:
        out += ["## Crashes and hangs", ""]
        out += [f"- {n} ({d}): `{c['id']}`: {c['message']}" for n, d, c in crashes]
        out.append("")
    if report.get("left_out"):
        out += ["## Left out of this run for time", ""]
        out += [f"- {n}: `{i}`: {why}" for n, ids in report["left_out"].items()
                for i, why in ids.items()]
        out.append("")
    out += ["## Adaptations made at run time", "",
            "The files come from several PyTorch commits; where one imports a helper the "
            "installed torch lacks or renamed, the runner supplies it before the file is "
            "imported (`torch_pjrt/testing/upstream_compat.py`):", ""]
    out += [f"- {a}" for a in report["adaptations"]]
    out += ["", "## Tests excluded for `tpu`", ""]
    ex = upstream_exclusions.EXCLUSIONS
    if not ex:
        out.append("None.")
    for cls, tests in sorted(ex.items()):
        if tests == "*":
            out.append(f"- `{cls}` (whole class): {upstream_exclusions.CLASS_REASONS.get(cls)}")
        else:
            out += [f"- `{cls}.{t}`: {why}" for t, why in sorted(tests.items())]
    return "\n".join(out) + "\n"


def check(report, baseline_path) -> list:
    """Regressions against a recorded baseline: {file: minimum tpu twins passed}."""
    with open(baseline_path) as f:
        baseline = json.load(f)
    problems = []
    for name, minimum in baseline.get("twins_passed", {}).items():
        s = report["files"].get(name)
        if s is None or "compare" not in s:
            continue
        got = s["compare"]["twins_passed"]
        if got < minimum:
            problems.append(f"{name}: {got} tpu twins passed, below the recorded {minimum}")
        if any(s["crashes"].values()):
            problems.append(f"{name}: crashed or hung: {s['crashes']}")
    return problems


def derive_baseline(report, suite, seed):
    """{"twins_passed": {file: n}} for `suite`'s files and fractions, from a report (--json)
    of a run at fractions at least as large with the same seed: the suite's sample of a file
    is the subset of the run's tests that upstream_ids.in_sample keeps at the smaller fraction,
    less the tests the suite leaves out."""
    out = {}
    leave = SUITE_LEAVES_OUT.get(suite, {})
    for entry in SUITES[suite]:
        name, _, frac = entry.partition("@")
        name += ".py"
        frac = float(frac) if frac else 1.0
        s = report["files"].get(name)
        if not s or not s.get("tests") or s["fraction"] < frac:
            raise SystemExit(f"{name}: the report has no test list at fraction >= {frac}")
        keep = lambda i: upstream_ids.in_sample(i, frac, seed) and i not in leave.get(name, {})
        sub = {d: {"tests": {i: r for i, r in s["tests"][d].items() if keep(i)}}
               for d in ("cpu", "tpu")}
        out[name] = compare(sub["cpu"], sub["tpu"])["twins_passed"]
    return {"suite": suite, "seed": seed, "from": report.get("command", ""),
            "date": report.get("date", ""), "twins_passed": out}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m torch_pjrt.testing.upstream",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", help="names or paths; NAME@F samples F of that file")
    p.add_argument("--suite", choices=sorted(SUITES), help="a named selection of files")
    p.add_argument("-k", default="", help="pytest -k expression (use generic test names: "
                   "class names end in PRIVATEUSE1/TPU/CPU)")
    p.add_argument("--dir", default=default_dir())
    p.add_argument("--fraction", type=float, default=1.0, help="seeded sample of each file")
    p.add_argument("--seed", default="0")
    p.add_argument("--timeout", type=float, default=300.0, help="per-test watchdog, seconds")
    p.add_argument("--devices", default="cpu,tpu")
    p.add_argument("--fallback-too", action="store_true",
                   help="also run tpu with the CPU fallback on, reported apart")
    p.add_argument("--cache-dir", default="", help="TORCH_PJRT_CACHE_DIR for the children")
    p.add_argument("--json", default="", help="full results (every test) as JSON")
    p.add_argument("--markdown", default="", help="write the report as markdown here")
    p.add_argument("--check-against", default="", help="baseline JSON; exit 1 on regression")
    p.add_argument("--write-baseline", nargs=2, metavar=("REPORT_JSON", "OUT_JSON"),
                   help="derive --suite's baseline from a report of a larger run; runs nothing")
    args = p.parse_args(argv)
    if args.write_baseline:
        with open(args.write_baseline[0]) as f:
            base = derive_baseline(json.load(f), args.suite or "ci", args.seed)
        with open(args.write_baseline[1], "w") as f:
            json.dump(base, f, indent=1, sort_keys=True)
            f.write("\n")
        print(json.dumps(base["twins_passed"]))
        return 0
    args.devices = [d for d in args.devices.split(",") if d]
    report = run(args)
    text = markdown(report)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    print(text.split("## Failures by root cause")[0])
    if args.check_against:
        problems = check(report, args.check_against)
        for prob in problems:
            print("REGRESSION:", prob, file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
