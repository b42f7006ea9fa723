"""Mismatches the fuzzer knows about and does not count (each with its reason).

Each entry: ``op`` is a regular expression matched against the failing step's op name, ``kind``
the failure kind it covers (``value``, ``dtype``, ``shape``, ``stride``, ``alias``,
``exception``, ``tpu_error``, ``no_error``, ``inplace``) or ``*``, ``modes`` the eager modes it
applies to, ``reason`` why it is tolerated and where it is tracked. Keep this list short: an entry
hides a real difference from CPU, so it needs a tracked reason, not a shrug.
"""
from __future__ import annotations

import re

KNOWN: list[dict] = [
    {"op": r"index_put_(acc)?", "kind": "no_error", "modes": ("defer_and_fuse",),
     "detail": r".*shape mismatch: value tensor.*",
     "reason": "index_put_'s value-shape check runs in the lowering, so DeferAndFuse records "
               "the op and raises at the next flush (a RuntimeError from the read) instead of "
               "at the call; open, docs/reliability.md F9"},
    {"op": r"argm(in|ax)|sub(_scalar)?|rsub|softmax|log_softmax|(max|min)_dim",
     "kind": "no_error", "modes": ("defer_and_fuse",),
     "detail": r".*(does not support bool input|Subtraction, the `-` operator|Expected "
               r"reduction dim \d+ to have non-zero size|Dimension out of range).*",
     "reason": "checks that run in the lowering (bool argmin/argmax and subtraction, F11/F13; "
               "an empty reduced dim of max/min(dim); softmax's dim) are not made when "
               "DeferAndFuse records the op: the next read raises CPU's exception type; open, "
               "docs/reliability.md F9"},
    {"op": r"hypot|abs_?|ceil|floor_?|round|trunc|relu_?|softmax|log_softmax|sign",
     "kind": "*", "detail": r".*(not implemented for '(Bool|Int|Long)'|Boolean inputs not "
                            r"supported).*",
     "reason": "CPU has no kernel for this dtype (its check lives in the CPU kernel, not in "
               "the Meta kernel tpu takes output metadata from): tpu computes it or fails to "
               "compile with a RuntimeError; open, docs/reliability.md F1"},
    {"op": r"abs|logical_(not|and|or|xor)", "kind": "stride",
     "reason": "these ops' functional forms call their out= kernel with an empty output; the "
               "bridge resizes it row-major where CPU's TensorIterator keeps the input's "
               "layout (values and shapes match, only the strides of a non-contiguous input's "
               "result differ); open, in csrc/bridge (out= resizing), docs/reliability.md F2"},
]

# Out-of-range indices are generated in every mode: Debug raises CPU's exception at once,
# Strict and DeferAndFuse at the next synchronization (the runner synchronizes after such a
# step, program.py). A mismatch on such a step outside Debug mode would be a gap of those
# checks: counted apart, under this reason.
OOR_GAP = "out-of-range index not reported at the next synchronization outside debug mode"


def match(op: str, kind: str, mode: str, detail: str = "") -> dict | None:
    """The known entry covering a failure of `kind` at op `op` in `mode`, or None."""
    for entry in KNOWN:
        if "detail" in entry and not re.fullmatch(entry["detail"], detail or "", re.S):
            continue
        if entry["kind"] not in ("*", kind):
            continue
        if mode not in entry.get("modes", (mode,)):
            continue
        if re.fullmatch(entry["op"], op):
            return entry
    return None
