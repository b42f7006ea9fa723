"""One line at process exit saying what ran on the device (``TORCH_PJRT_EXIT_REPORT=1``).

For programs launched unchanged (``torchrun -m torchtitan.train ...``), where no code of the
user's can call ``torch.tpu.fallback_ops()`` or ``torch.tpu.metrics()`` at the end: the line is
``torch_pjrt exit report: {json}`` on stderr, with the rank (``RANK``; null where unset, as in
torchrun's own agent process, which may start the runtime without running anything), the aten ops
that fell back to the CPU with their counts, and the process-wide counters. Harnesses parse it
(torch_pjrt/testing/titan.py)."""

from __future__ import annotations

import atexit
import json
import os
import sys

PREFIX = "torch_pjrt exit report: "
_installed = False


def _report() -> None:
    from . import device

    # a process that never started the runtime (torchrun's agent, which imports torch and so
    # this package) has nothing to say, and a report from it would read as one more rank
    if device._C is None or not device._C.is_initialized():
        return
    try:
        rank = os.environ.get("RANK", "")
        line = json.dumps({"rank": int(rank) if rank.strip() else None,
                           "fallback_ops": device.fallback_ops(),
                           "metrics": device.metrics()}, sort_keys=True)
    except Exception as e:  # noqa: BLE001 - exit must go on; say why there is no report
        line = json.dumps({"error": f"{type(e).__name__}: {e}"})
    sys.stderr.write(PREFIX + line + "\n")
    sys.stderr.flush()


def install() -> None:
    """Registers the report (idempotent)."""
    global _installed
    if not _installed:
        atexit.register(_report)
        _installed = True


def parse(text: str) -> list[dict]:
    """Every report in a log (one per process), in order."""
    out = []
    for line in text.splitlines():
        at = line.find(PREFIX)
        if at >= 0:
            try:
                out.append(json.loads(line[at + len(PREFIX):]))
            except ValueError:
                continue
    return out
