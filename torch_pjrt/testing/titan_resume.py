"""TorchTitan DCP checkpoint save, kill, resume on tpu: the resumed losses must be bit-identical
(issue 37).

``python -m torch_pjrt.testing.titan_resume [--module llama3 --config llama3_debugmodel
--ranks 2 --steps 20 --save-at 10] [torchtitan args, e.g.
--parallelism.data-parallel-shard-degree 2 --compile.enable]`` runs TorchTitan's own trainer
(``torchrun -m torchtitan.train``, unchanged, as torch_pjrt/testing/titan.py does) three times
on ``tpu``, each from the CPU-made seed checkpoint, with checkpointing on
(``--checkpoint.interval SAVE_AT``, synchronous ``--checkpoint.async-mode disabled``):

A. uninterrupted, steps 1..STEPS;
B. the same command in a fresh dump folder, its whole process group SIGKILLed as soon as the
   step-SAVE_AT checkpoint is complete (its ``.metadata``, which DCP writes last, exists and
   every rank has logged "Finished saving the checkpoint", or step SAVE_AT+1 is logged);
C. the same command again on B's dump folder: torchtitan finds ``checkpoint/step-SAVE_AT``
   (a checkpoint in the run's own folder wins over ``--checkpoint.initial-load-path``,
   CheckpointManager._load) and restores model, optimizer, lr scheduler, dataloader and
   train state, then trains steps SAVE_AT+1..STEPS.

Pass: C logged "Loading the checkpoint from .../step-SAVE_AT" and "Training starts at step
SAVE_AT+1", and C's printed loss and grad_norm strings for steps SAVE_AT+1..STEPS equal A's.
Stronger checks, reported and required too: the final checkpoints (``step-STEPS``: the
full state where the config sets ``last_save_model_only=False``, as the debug configs do,
else the model alone) of A and C are bitwise equal, every tensor and every other leaf; so
are A's and B's step-SAVE_AT checkpoints (model, optimizer, lr scheduler, dataloader, train
state), which shows the run itself is deterministic up to the save. B's steps 1..SAVE_AT
must equal A's, and B must leave only ``step-SAVE_AT`` behind (torchrun starts each rank in a
session of its own, so the kill walks the process tree: killing torchrun's process group
alone leaves the ranks training to the end).

``check_resume(work, module, config, ranks, args)`` is the same for a test; it returns the
record (``record["ok"]``).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Optional

from torch_pjrt.testing import titan

_STEP = re.compile(r"step:\s+(\d+)\s+loss:\s+(\S+)\s+grad_norm:\s+(\S+)")


def printed_steps(output: str) -> dict[int, tuple[str, str]]:
    """Per step, the loss and grad_norm exactly as torchtitan printed them (first rank's
    line; every rank prints the same global values)."""
    steps = {}
    for line in output.splitlines():
        m = _STEP.search(line)
        if m:
            steps.setdefault(int(m.group(1)), (m.group(2), m.group(3)))
    return steps


def resume_command(module: str, config: str, ranks: int, args, *, steps: int, save_at: int,
                   assets, dump: str, seed_ckpt: str) -> list[str]:
    """titan.command's tpu run with saving on: every SAVE_AT steps, synchronously."""
    cmd = titan.command("tpu", module, config, ranks, (), (), steps=steps, assets=assets,
                        dump=dump, seed_ckpt=seed_ckpt)
    cmd.remove("--checkpoint.load-only")
    return cmd + ["--checkpoint.interval", str(save_at), "--checkpoint.async-mode", "disabled",
                  "--checkpoint.keep-latest-k", "0", *args]


def run_until(cmd: list[str], environ: dict, cwd: str, timeout: float,
              stop: Callable[[str], bool], poll: float = 0.2):
    """Runs one torchrun in its own session; SIGKILLs the whole group once ``stop(output so
    far)`` holds. Returns (exit code or None when killed or timed out, output, seconds,
    killed by stop)."""
    log_path = os.path.join(cwd, f"run-{time.time_ns()}.log")
    start = time.monotonic()
    killed = False
    with open(log_path, "w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=environ, cwd=cwd,
                                start_new_session=True)
        with open(log_path) as reader:
            output = ""
            while proc.poll() is None:
                output += reader.read()
                if stop(output):
                    titan.kill_tree(proc.pid)
                    killed = True
                    break
                if time.monotonic() - start > timeout:
                    titan.kill_tree(proc.pid)
                    break
                time.sleep(poll)
            proc.wait()
            time.sleep(1)
            output += reader.read()
    os.unlink(log_path)
    rc = None if (killed or proc.returncode == -signal.SIGKILL) else proc.returncode
    return rc, output, time.monotonic() - start, killed


def _load_dcp(path: str) -> dict:
    """A DCP checkpoint as one flat CPU state dict (no process group needed)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "sd.pt")
        dcp_to_torch_save(path, out)
        return torch.load(out, map_location="cpu", weights_only=False)


def _diff(a, b, prefix: str = "") -> list[str]:
    """Keys whose values are not bitwise equal (tensors: same dtype, shape and bytes)."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return [prefix or "<root>"]
        if a.dtype != b.dtype or a.shape != b.shape:
            return [prefix or "<root>"]
        same = torch.equal(a.detach().reshape(-1).contiguous().view(torch.uint8),
                           b.detach().reshape(-1).contiguous().view(torch.uint8))
        return [] if same else [prefix or "<root>"]
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{prefix}{k} (only one side)" for k in set(a) ^ set(b)]
        for k in sorted(set(a) & set(b), key=str):
            out += _diff(a[k], b[k], f"{prefix}{k}.")
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [prefix or "<root>"]
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += _diff(x, y, f"{prefix}{i}.")
        return out
    return [] if a == b else [prefix or "<root>"]


def compare_checkpoints(p: str, q: str) -> dict:
    """Bitwise comparison of two DCP checkpoints: {"identical", "keys", "differing"}."""
    if not (os.path.isfile(os.path.join(p, ".metadata"))
            and os.path.isfile(os.path.join(q, ".metadata"))):
        return {"identical": False, "error": f"missing checkpoint: {p} or {q}"}
    a, b = _load_dcp(p), _load_dcp(q)
    differing = [k.rstrip(".") for k in _diff(a, b)]
    return {"identical": not differing, "top_keys": sorted(k for k in a if "." not in k),
            "leaves": _leaves(a), "differing": differing[:20], "n_differing": len(differing)}


def _leaves(x) -> int:
    if isinstance(x, dict):
        return sum(_leaves(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(_leaves(v) for v in x)
    return 1


def _saved(folder: str, step: int, ranks: int, save_at: int) -> Callable[[str], bool]:
    meta = os.path.join(folder, "checkpoint", f"step-{step}", ".metadata")

    def stop(output: str) -> bool:
        if not os.path.isfile(meta):
            return False
        return (output.count("Finished saving the checkpoint") >= ranks
                or any(s > save_at for s in printed_steps(output)))
    return stop


def check_resume(work: str, module: str = "llama3", config: str = "llama3_debugmodel",
                 ranks: int = 2, args=(), steps: int = 20, save_at: int = 10,
                 timeout: float = 900, keep: bool = False) -> dict:
    """Runs A (uninterrupted), B (killed after the step-SAVE_AT save) and C (resumed from B's
    folder) and returns the record; ``record["ok"]`` says whether C's steps SAVE_AT+1..STEPS
    are bit-identical to A's (printed loss and grad_norm, final weights)."""
    import torch

    if not 0 < save_at < steps:
        raise ValueError("need 0 < save_at < steps")
    os.makedirs(work, exist_ok=True)
    assets = titan.make_assets(os.path.join(work, "assets"))
    seed = titan.seed_checkpoint(module, config, work, assets, timeout)
    environ = titan.env("tpu", ranks, work)
    record = {"module": module, "config": config, "ranks": ranks, "args": list(args),
              "steps": steps, "save_at": save_at, "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M")}
    problems = []
    dumps = {k: tempfile.mkdtemp(prefix=f"resume-{k}-", dir=work) for k in "AB"}

    def cmd(dump):
        return resume_command(module, config, ranks, args, steps=steps, save_at=save_at,
                              assets=assets, dump=dump, seed_ckpt=seed)

    runs = {}
    try:
        # A: uninterrupted.
        rc, out, secs, _ = run_until(cmd(dumps["A"]), environ, work, timeout, lambda o: False)
        runs["A"] = {"rc": rc, "seconds": round(secs, 1), "out": out}
        # B: killed once the step-SAVE_AT checkpoint is complete.
        rc, out, secs, killed = run_until(cmd(dumps["B"]), environ, work, timeout,
                                          _saved(dumps["B"], save_at, ranks, save_at))
        runs["B"] = {"rc": rc, "seconds": round(secs, 1), "out": out, "killed": killed}
        ckpts = sorted(os.listdir(os.path.join(dumps["B"], "checkpoint"))) if os.path.isdir(
            os.path.join(dumps["B"], "checkpoint")) else []
        runs["B"]["checkpoints"] = ckpts
        if ckpts != [f"step-{save_at}"]:
            problems.append(f"run B left checkpoints {ckpts}, not just step-{save_at}")
            killed = False  # a rank outlived the kill: C would not resume from save_at
        # C: the same command on B's folder.
        if killed:
            rc, out, secs, _ = run_until(cmd(dumps["B"]), environ, work, timeout,
                                         lambda o: False)
            runs["C"] = {"rc": rc, "seconds": round(secs, 1), "out": out}
        else:
            problems.append(f"run B was not killed right after its step-{save_at} save "
                            f"(rc {rc})")

        for k, r in runs.items():
            r["steps"] = printed_steps(r["out"])
            if k != "B" and r["rc"] != 0:
                problems.append(f"run {k} " + ("timed out" if r["rc"] is None else
                                               f"exited {r['rc']}") + ": "
                                + titan._error_tail(r["out"]))
        a = runs["A"]["steps"]
        b = runs["B"]["steps"]
        record["A"] = {"seconds": runs["A"]["seconds"], "rc": runs["A"]["rc"],
                       "losses": [a[s][0] for s in sorted(a)],
                       "grad_norms": [a[s][1] for s in sorted(a)]}
        record["B"] = {"seconds": runs["B"]["seconds"], "killed": runs["B"]["killed"],
                       "checkpoints_at_kill": runs["B"]["checkpoints"],
                       "last_step_logged": max(b) if b else 0,
                       "losses": [b[s][0] for s in sorted(b)]}
        if sorted(a) != list(range(1, steps + 1)):
            problems.append(f"run A logged steps {sorted(a)}")
        if [b.get(s) for s in range(1, save_at + 1)] != [a.get(s) for s in
                                                         range(1, save_at + 1)]:
            problems.append(f"run B's steps 1..{save_at} differ from A's")
        if "C" in runs:
            c, out = runs["C"]["steps"], runs["C"]["out"]
            ckpt = os.path.join(dumps["B"], "checkpoint", f"step-{save_at}")
            loaded = f"Loading the checkpoint from {ckpt}." in out
            starts = f"Training starts at step {save_at + 1}" in out
            record["C"] = {"seconds": runs["C"]["seconds"], "rc": runs["C"]["rc"],
                           "loaded_step": save_at if loaded else None,
                           "starts_at": save_at + 1 if starts else None,
                           "losses": [c[s][0] for s in sorted(c)],
                           "grad_norms": [c[s][1] for s in sorted(c)]}
            if not (loaded and starts):
                problems.append(f"run C did not resume from step {save_at} "
                                f"(loaded: {loaded}, starts at {save_at + 1}: {starts})")
            tail = range(save_at + 1, steps + 1)
            if sorted(c) != list(tail):
                problems.append(f"run C logged steps {sorted(c)}")
            a_tail = [a.get(s) for s in tail]
            c_tail = [c.get(s) for s in tail]
            record["losses_identical"] = [x and x[0] for x in a_tail] == \
                [x and x[0] for x in c_tail]
            record["grad_norms_identical"] = [x and x[1] for x in a_tail] == \
                [x and x[1] for x in c_tail]
            for s, x, y in zip(tail, a_tail, c_tail):
                if x != y:
                    problems.append(f"step {s}: A loss/grad_norm {x} vs resumed {y}")
            # Bitwise: final weights (model-only last save) and the state saved at SAVE_AT.
            record["final_weights"] = compare_checkpoints(
                os.path.join(dumps["A"], "checkpoint", f"step-{steps}"),
                os.path.join(dumps["B"], "checkpoint", f"step-{steps}"))
            if not record["final_weights"]["identical"]:
                problems.append(f"final weights differ: {record['final_weights']}")
        record["saved_state_A_vs_B"] = compare_checkpoints(
            os.path.join(dumps["A"], "checkpoint", f"step-{save_at}"),
            os.path.join(dumps["B"], "checkpoint", f"step-{save_at}"))
        if not record["saved_state_A_vs_B"]["identical"]:
            problems.append(f"step-{save_at} checkpoints of A and B differ: "
                            f"{record['saved_state_A_vs_B']}")
        fallbacks = {}
        for k in ("A", "C"):
            if k in runs:
                for r in titan.parse(runs[k]["out"])["reports"]:
                    for op, n in (r.get("fallback_ops") or {}).items():
                        fallbacks[op] = fallbacks.get(op, 0) + n
        record["fallback_ops"] = fallbacks
    finally:
        if not keep:
            for d in dumps.values():
                shutil.rmtree(d, ignore_errors=True)
        else:
            record["dumps"] = dumps
    record["problems"] = problems
    record["ok"] = not problems
    return record


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--module", default="llama3")
    ap.add_argument("--config", default="llama3_debugmodel")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--save-at", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(),
                                                   "torch_pjrt_titan_resume"))
    ap.add_argument("--keep", action="store_true", help="keep the dump folders")
    a, extra = ap.parse_known_args(argv)
    rec = check_resume(a.work, a.module, a.config, a.ranks, tuple(extra), a.steps, a.save_at,
                       a.timeout, a.keep)
    print(json.dumps(rec, indent=1))
    return 0 if rec["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
