"""Mismatches the fuzzer knows about and does not count (each with its reason).

Each entry: ``op`` is a regular expression matched against the failing step's op name, ``kind``
the failure kind it covers (``value``, ``dtype``, ``shape``, ``stride``, ``alias``,
``exception``, ``tpu_error``, ``no_error``, ``inplace``, ``deferred``) or ``*``, ``modes`` the
eager modes it applies to, ``detail`` (optional) a regular expression the failure's message
must match, ``reason`` why it is tolerated and where it is tracked. Keep this list short: an
entry hides a real difference from CPU, so it needs a tracked reason, not a shrug.
"""
from __future__ import annotations

import re

KNOWN: list[dict] = [
    {"op": r".*", "kind": "deferred", "modes": ("defer_and_fuse",),
     "reason": "a check made by the op's lowering (not by its Meta kernel) runs when the "
               "recorded op is built: DeferAndFuse raises CPU's exception type at the next "
               "flush instead of at the call (the runner flushes to see it); open, "
               "docs/reliability.md F9"},
    {"op": r"softmax|log_softmax", "kind": "*",
     "detail": r".*(not implemented for '(Bool|Int|Long)'|the `-` operator, with two bool).*",
     "reason": "CPU has no kernel for this dtype (its check lives in the CPU kernel, not in "
               "the Meta kernel tpu takes output metadata from); the elementwise ops of F1 "
               "raise CPU's error now (csrc/ops/no_kernel.c), softmax of bools still takes "
               "another path (it raises RuntimeError about bool subtraction); open, "
               "docs/reliability.md F1"},
    {"op": r"to|type_as|_to_copy", "kind": "value",
     "detail": r".*cpu -(2147483648|9223372036854775808) tpu .*",
     "reason": "a float NaN, infinity or out-of-range value converted to int32/int64 is "
               "undefined in C++: CPU (x86) gives the 'integer indefinite' minimum, tpu XLA's "
               "conversion (0 for NaN, saturation otherwise; CUDA's is the same for NaN); seed "
               "2000010154, docs/reliability.md F25"},
    {"op": r"roll", "kind": "stride",
     "reason": "CPU's roll result keeps a permuted layout in some cases (seed 2000009099: a "
               "bool [1, 2, 1, 3] result with strides (6, 1, 6, 2)); PyTorch's Meta kernel, "
               "which tpu takes output metadata from, gives row-major strides; values match; "
               "docs/reliability.md"},
    {"op": r"logical_(and|or|xor)", "kind": "stride",
     "reason": "PyTorch's Meta kernel of logical_and/or/xor, which tpu takes output metadata "
               "from, lays the result out row-major when the first operand is 0-d and the "
               "other transposed (meta: logical_and(0-d, x.t()).stride() == (3, 1)); CPU's "
               "TensorIterator keeps the transposed layout; values match; seeds 2000010726, "
               "2000010964, 2000013589; docs/reliability.md F2"},
    {"op": r"div_floor|conv1d", "kind": "stride",
     "reason": "PyTorch's own Meta kernels give these strides (div with rounding_mode='floor' "
               "of a transposed input, conv1d with a transposed weight: row-major on meta, the "
               "input's layout on CPU); tpu takes output metadata from Meta; docs/reliability.md "
               "F2"},
    {"op": r"roll", "kind": "tpu_error", "detail": r".*Dimension out of range.*",
     "reason": "CPU's roll returns an empty input before it checks dim; PyTorch's Meta kernel, "
               "which tpu takes output metadata from, checks it and raises IndexError (as it "
               "does on CPU for a non-empty input); docs/reliability.md F18"},
    {"op": r"bmm|baddbmm", "kind": "tpu_error", "detail": r".*expected scalar type.*",
     "reason": "CPU's bmm/baddbmm return early for an empty operand, before their dtype check "
               "(float32 @ float64 of shapes [1, 1, 0] and [1, 0, 1] gives a float64 zero); "
               "PyTorch's Meta kernel, which tpu takes output metadata from, makes the check "
               "and tpu raises; seed 2000008749, docs/reliability.md"},
    {"op": r"nansum", "kind": "value", "detail": r".*\((bfloat16|float16)\).*",
     "reason": "CPU's nansum of bfloat16/float16 over several dimensions (dim=(0, 2) of a "
               "[6, 3, 4] tensor) rounds partial sums to the half type: it differs from CPU's "
               "own sum of the same values and from the float64 sum rounded once, which tpu "
               "gives (it accumulates in float32 as CPU's sum does); over one dimension or all "
               "of them CPU's nansum equals its sum; seed 2000016084, docs/reliability.md"},
    {"op": r"prod", "kind": "value", "detail": r".*\(bfloat16\).*",
     "reason": "CPU's prod of bfloat16 rounds every partial product to bfloat16; tpu "
               "accumulates in float32 and rounds once, closer to the exact product (seed "
               "2000006605: exact 10.654, CPU 10.8125, tpu 10.625); docs/reliability.md F17"},
    {"op": r"(sigmoid|div|div_scalar|div_tensor|exp|log|tanh|sin|cos|pow|rsqrt|sqrt)_?",
     "kind": "inplace", "max_ulps": 2,
     "reason": "a float result one or two units in the last place from CPU's, seen through an "
               "integer view of its bits (the compared integers differ by at most 2): XLA's "
               "implementation of the function (or its division by a scalar as a reciprocal "
               "multiply, F26) is that close to CPU's, which float tolerances accept "
               "everywhere else; seeds 2000008531 (sigmoid_), 2000011918 (div_); "
               "docs/reliability.md F26, F29"},
]

# Out-of-range indices are generated in every mode: Debug raises CPU's exception at once,
# Strict and DeferAndFuse at the next synchronization (the runner synchronizes after such a
# step, program.py). A mismatch on such a step outside Debug mode would be a gap of those
# checks: counted apart, under this reason.
OOR_GAP = "out-of-range index not reported at the next synchronization outside debug mode"


def _within_ulps(detail: str, ulps: int) -> bool:
    """Whether a mismatch's detail ("... cpu A tpu B ...") shows two integers (the bits of a
    float seen through an integer view) at most `ulps` apart."""
    m = re.search(r"cpu (-?\d+) tpu (-?\d+)(?![\d.e])", detail or "")
    return bool(m) and abs(int(m.group(1)) - int(m.group(2))) <= ulps


def match(op: str, kind: str, mode: str, detail: str = "") -> dict | None:
    """The known entry covering a failure of `kind` at op `op` in `mode`, or None."""
    for entry in KNOWN:
        if "detail" in entry and not re.fullmatch(entry["detail"], detail or "", re.S):
            continue
        if "max_ulps" in entry and not _within_ulps(detail, entry["max_ulps"]):
            continue
        if entry["kind"] not in ("*", kind):
            continue
        if mode not in entry.get("modes", (mode,)):
            continue
        if re.fullmatch(entry["op"], op):
            return entry
    return None
