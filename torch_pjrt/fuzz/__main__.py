"""python -m torch_pjrt.fuzz --programs N --seed S --mode strict|debug|defer_and_fuse|all
[--isolate] [--out DIR]: a differential fuzzer of the tpu device against CPU."""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torch_pjrt.fuzz", description=__doc__)
    ap.add_argument("--programs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mode", default="all",
                    choices=["strict", "debug", "defer_and_fuse", "all"])
    ap.add_argument("--isolate", action="store_true",
                    help="run in a worker subprocess; a crash or hang becomes a failure")
    ap.add_argument("--out", default=None, help="directory for failures.jsonl")
    ap.add_argument("--min-ops", type=int, default=5)
    ap.add_argument("--max-ops", type=int, default=50)
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="seconds per program under --isolate before it counts as a hang")
    ap.add_argument("--progress", type=int, default=0, metavar="N",
                    help="print the running summary every N programs")
    ap.add_argument("--no-shrink", action="store_true", help="do not minimize failures")
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
    if a.worker:
        runner.worker(a.mode, a.seed, a.start, a.programs, a.min_ops, a.max_ops,
                      not a.no_shrink, a.crash_at)
        return 0
    modes = runner.MODES if a.mode == "all" else (a.mode,)
    bad = 0
    lines = []
    for mode in modes:
        s = runner.run_mode(mode, a.programs, a.seed, a.out, a.isolate, a.min_ops, a.max_ops,
                            a.timeout, shrink=not a.no_shrink, progress=a.progress)
        lines.append(s.line())
        print(s.line(), flush=True)
        bad += s.counts["mismatch"] + s.counts["error"]
    if len(lines) > 1:
        print("\n".join(lines))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
