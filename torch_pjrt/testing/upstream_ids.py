"""Test ids of PyTorch's device-generic tests with the device taken out, so that a test's CPU
instance and its ``tpu`` twin share one id.

``instantiate_device_type_tests`` names classes ``<Generic><DEVICE>`` and tests
``<name>_<device>[_<dtype>...]``. For this backend the device is spelled two ways in one file:
the first class instantiated is ``...PRIVATEUSE1`` and later ones ``...TPU`` (the test base
renames itself in ``setUpClass``), so both spellings normalize to ``DEV``.
"""
from __future__ import annotations

import hashlib
import re

_CLASS_SUFFIX = re.compile(r"(PRIVATEUSE1|TPU|CPU)$")
_TEST_DEVICE = re.compile(r"_(privateuse1|tpu|cpu)(?=_|$|\[)")


def normalize(nodeid: str) -> str:
    """``path::TestFooTPU::test_bar_tpu_float32`` -> ``TestFooDEV::test_bar_dev_float32``
    (the file part is dropped: ids are kept per file)."""
    parts = nodeid.split("::")
    if len(parts) >= 3:
        cls, test = parts[-2], parts[-1]
        cls = _CLASS_SUFFIX.sub("DEV", cls)
        test = _TEST_DEVICE.sub("_dev", test)
        return f"{cls}::{test}"
    return "::".join(parts[1:]) if len(parts) > 1 else nodeid


def generic_class(normalized_id: str) -> str:
    """The generic (device-less) class name of a normalized id: ``TestFoo``."""
    cls = normalized_id.split("::")[0]
    return cls[:-3] if cls.endswith("DEV") else cls


def in_sample(normalized_id: str, fraction: float, seed: str) -> bool:
    """Seeded, stateless sampling: the same id is in or out for every device and every run with
    the same seed, whatever else was collected."""
    if fraction >= 1.0:
        return True
    digest = hashlib.sha256(f"{seed}:{normalized_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2.0**64 < fraction
