"""CLI: `python -m torch_pjrt.models [run options]`, `... report`, `... list`, `... worker`."""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from . import zoos  # noqa: E402

DEFAULT_DIR = os.path.join("docs", "models")


def _default_out(zoo_list, mode="eager", eager_mode="strict"):
    tag = zoo_list[0] if len(zoo_list) == 1 else "all"
    # each mode's results go to a file of their own, so that --resume and --rerun see only that
    # mode's records: Strict eager results-<zoo>.jsonl, other eager modes
    # results-<zoo>-<eager mode>.jsonl, compiled results-<zoo>-compile[-<eager mode>].jsonl
    parts = [] if mode == "eager" else [mode]
    if eager_mode != "strict":
        parts.append(eager_mode)
    return os.path.join(DEFAULT_DIR, "-".join([f"results-{tag}"] + parts) + ".jsonl")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:
        p = argparse.ArgumentParser(prog="python -m torch_pjrt.models worker")
        p.add_argument("--eager-mode", default="strict")
        p.add_argument("--mode", default="eager", choices=("eager", "compile"))
        a = p.parse_args(argv[1:])
        from .runner import serve
        serve(a.eager_mode, a.mode)
        return 0
    if argv[:1] == ["report"]:
        p = argparse.ArgumentParser(prog="python -m torch_pjrt.models report",
                                    description="writes the markdown report from JSONL results")
        p.add_argument("results", nargs="*", help=f"JSONL files (default {DEFAULT_DIR}/results-*.jsonl)")
        p.add_argument("-o", "--output", default=os.path.join("docs", "models.md"))
        a = p.parse_args(argv[1:])
        from .report import write_report
        path = write_report(a.results or None, a.output)
        print(f"wrote {path}")
        return 0
    cmd_list = argv[:1] == ["list"]
    if argv[:1] in (["run"], ["list"]):
        argv = argv[1:]
    p = argparse.ArgumentParser(prog="python -m torch_pjrt.models",
                                description="runs models on CPU and tpu and compares them")
    p.add_argument("--zoo", action="append", choices=sorted(zoos.ZOOS),
                   help="zoo to run (repeatable; default: all)")
    p.add_argument("-k", action="append", default=[], metavar="SUBSTR",
                   help="only models whose 'zoo/name' contains SUBSTR (repeatable: any)")
    p.add_argument("-j", "--jobs", type=int, default=2, help="parallel workers (default 2)")
    p.add_argument("--limit", type=int, default=0, help="at most this many models")
    p.add_argument("--resume", action="store_true", help="skip models already in the output file")
    p.add_argument("--rerun", action="append", default=[], metavar="STATUS",
                   help="only models whose last record in the output file has this status "
                        "(repeatable: any), e.g. after a harness or lowering change")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per model (default 300)")
    p.add_argument("--per-worker", type=int, default=25,
                   help="models a worker process runs before a fresh one replaces it")
    p.add_argument("--eager-mode", default="strict", choices=("strict", "debug", "defer_and_fuse"))
    p.add_argument("--compile", action="store_true",
                   help="compiled mode: the eval forward as torch.compile(model) (no backend=), "
                        "the training step's forward+loss, backward and SGD step compiled; "
                        "records Dynamo's graphs, graph breaks and recompiles (mode 'compile')")
    p.add_argument("--out", help="JSONL file (default docs/models/results-<zoo>.jsonl; "
                                 "results-<zoo>-<eager mode>.jsonl for another eager mode; "
                                 "with --compile results-<zoo>-compile.jsonl)")
    a = p.parse_args(argv)
    zoo_list = a.zoo or list(zoos.ZOOS)
    todo = zoos.select(zoo_list, a.k, 0)
    if cmd_list:
        for z, n in todo[: a.limit or None]:
            print(f"{z}/{n}")
        return 0
    mode = "compile" if a.compile else "eager"
    out = a.out or _default_out(zoo_list, mode, a.eager_mode)
    if a.resume or a.rerun:
        from .runner import load_records
        last = {(r["zoo"], r["name"]): r["status"] for r in load_records(out)}
        # --resume: the models not yet run; --rerun: those whose last status is named; both: either
        todo = [t for t in todo if (a.resume and t not in last) or last.get(t) in a.rerun]
    if a.limit:
        todo = todo[: a.limit]
    from .runner import run_all, thread_env, worker_threads
    threads = thread_env(worker_threads(a.jobs))["OMP_NUM_THREADS"]
    print(f"{len(todo)} models -> {out} ({a.jobs} workers, {a.timeout:.0f} s each, {mode}, "
          f"{threads} CPU threads each)", flush=True)
    try:
        recs = run_all(todo, out, jobs=a.jobs, timeout=a.timeout, per_worker=a.per_worker,
                       eager_mode=a.eager_mode, progress=lambda s: print(s, flush=True),
                       mode=mode)
    except KeyboardInterrupt:
        return 130
    counts = {}
    for r in recs:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print("summary: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
