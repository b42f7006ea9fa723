"""Upstream tests that cannot apply to the ``tpu`` device, with the reason for each.

Applied through ``PrivateUse1TestBase.test_exclusions`` (``upstream_compat``): the excluded
tests are never instantiated for ``tpu``, as ``@onlyCUDA`` tests are never instantiated for CPU.
The runner reports every exclusion with its reason and leaves the excluded tests out of the
headline's denominator. A test that *fails* on ``tpu`` does not belong here: it belongs in the
report's failures until it is fixed.

Format: ``{generic class name: {generic test name (without device/dtype suffix): reason}}``,
or ``{generic class name: "*"}`` for a whole class (with the reason in ``CLASS_REASONS``).
"""
from __future__ import annotations

EXCLUSIONS: dict = {}

CLASS_REASONS: dict = {}


def reason(generic_class: str, test_name: str) -> str:
    tests = EXCLUSIONS.get(generic_class)
    if tests == "*":
        return CLASS_REASONS.get(generic_class, "")
    if isinstance(tests, dict):
        return tests.get(test_name, "")
    return ""
