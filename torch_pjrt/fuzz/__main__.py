"""python -m torch_pjrt.fuzz --programs N --seed S --mode strict|debug|defer_and_fuse|all
[--isolate] [--out DIR] [--shapes vocab|free] [--shrink new|all|none] [--minutes M]
[--pause-file PATH]: a differential fuzzer of the tpu device against CPU."""
from __future__ import annotations

import argparse
import sys
import time

# --shrink auto and --shapes auto pick the throughput settings from this many programs on.
BIG_RUN = 200


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torch_pjrt.fuzz", description=__doc__)
    ap.add_argument("--programs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mode", default="all",
                    choices=["strict", "debug", "defer_and_fuse", "all"])
    ap.add_argument("--isolate", action="store_true",
                    help="run in a worker subprocess; a crash or hang becomes a failure")
    ap.add_argument("--out", default=None, help="directory for failures.jsonl")
    ap.add_argument("--first", type=int, default=0, metavar="K",
                    help="number the programs from K (seeds SEED * 1000003 + K ...), to go on "
                    "where an earlier run of the same seed stopped")
    ap.add_argument("--min-ops", type=int, default=5)
    ap.add_argument("--max-ops", type=int, default=50)
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="seconds per program under --isolate before it counts as a hang")
    ap.add_argument("--progress", type=int, default=0, metavar="N",
                    help="print the running summary every N programs")
    ap.add_argument("--no-shrink", action="store_true", help="do not minimize failures "
                    "(the same as --shrink none)")
    ap.add_argument("--shrink", choices=["all", "new", "none", "auto"], default="auto",
                    help="minimize every failure (all), only the first failure of each "
                    "signature not yet minimized in this run or in DIR/failures.jsonl (new), or "
                    "none; auto: new when --programs >= %d, else all" % BIG_RUN)
    ap.add_argument("--shapes", choices=["free", "vocab", "auto"], default="auto",
                    help="input shapes drawn freely (each dim 0..5) or from a small fixed "
                    "vocabulary per rank (vocab; far fewer programs to compile, so with a "
                    "persistent TORCH_PJRT_CACHE_DIR most steps reuse compiled programs); "
                    "auto: vocab when --programs >= %d, else free" % BIG_RUN)
    ap.add_argument("--pause-file", default=None, metavar="PATH",
                    help="while PATH exists, finish the current program and wait")
    ap.add_argument("--minutes", type=float, default=None,
                    help="start no program after this many minutes (per mode)")
    ap.add_argument("--until", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--replay", default=None, metavar="FILE",
                    help="run one program (JSON) on both sides and exit (crash minimization)")
    ap.add_argument("--report", nargs="+", default=None, metavar="JSONL",
                    help="group saved failures by signature, smallest reproduction of each")
    ap.add_argument("--crash-at", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    import torch  # noqa: F401
    import torch_pjrt  # noqa: F401  (registers the tpu device)

    from . import runner

    if a.report:
        print(runner.report(a.report))
        return 0
    if a.replay:
        import json

        from . import program

        with open(a.replay) as f:
            prog = json.load(f)
        def trace(i):
            sys.stdout.write("STEP %d\n" % i)
            sys.stdout.flush()

        try:
            program.execute(prog, prog["mode"], trace=trace)
        except program.Failure:
            return 1
        return 0
    big = a.programs >= BIG_RUN
    shrink = "none" if a.no_shrink else a.shrink
    if shrink == "auto":
        shrink = "new" if big else "all"
    shapes = a.shapes if a.shapes != "auto" else ("vocab" if big else "free")
    if a.worker:
        runner.worker(a.mode, a.seed, a.start, a.programs, a.min_ops, a.max_ops, shrink,
                      a.crash_at, shapes, a.out, a.pause_file, a.until)
        return 0
    modes = runner.MODES if a.mode == "all" else (a.mode,)
    bad = 0
    lines = []
    for mode in modes:
        until = None if a.minutes is None else time.time() + 60 * a.minutes
        s = runner.run_mode(mode, a.programs, a.seed, a.out, a.isolate, a.min_ops, a.max_ops,
                            a.timeout, shrink=shrink, progress=a.progress, shapes=shapes,
                            pause_file=a.pause_file, until=until, first=a.first)
        lines.append(s.line())
        print(s.line(), flush=True)
        bad += s.counts["mismatch"] + s.counts["error"]
    if len(lines) > 1:
        print("\n".join(lines))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
