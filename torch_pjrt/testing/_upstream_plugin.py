"""The pytest plugin loaded into every child process of ``torch_pjrt.testing.upstream``.

It runs inside the child that executes one upstream file for one device type, and:

- before the test file is imported, applies this backend's exclusions through the device test
  base (``PrivateUse1TestBase.test_exclusions``, the mechanism ``common_device_type`` offers
  backends) and the run-time adaptations of ``upstream_compat``;
- keeps the seeded sample of tests the parent asked for (by normalized id, so the CPU and the
  ``tpu`` runs keep the same tests) and drops those already recorded by an earlier child of the
  same run (a child restarts after a test crashed or hung the process);
- writes one JSON line per test (``start`` before it runs, then its outcome) to the file named by
  ``TORCH_PJRT_UPSTREAM_RESULTS``, flushed at once, so a crash leaves the crashing test's
  ``start`` as the last line;
- arms ``faulthandler.dump_traceback_later(exit=True)`` around each test so that a hang ends the
  process (the parent records it as a hang of that test) instead of stalling the run.

Configuration comes from environment variables set by the parent (names below); this module is
never imported by the runtime path.
"""
from __future__ import annotations

import faulthandler
import json
import os
import sys
import time

import pytest

from torch_pjrt.testing import upstream_ids

RESULTS = os.environ.get("TORCH_PJRT_UPSTREAM_RESULTS", "")
SKIP_IDS = os.environ.get("TORCH_PJRT_UPSTREAM_DONE", "")  # file of normalized ids to drop
FRACTION = float(os.environ.get("TORCH_PJRT_UPSTREAM_FRACTION", "1") or 1)
SEED = os.environ.get("TORCH_PJRT_UPSTREAM_SEED", "0")
TIMEOUT = float(os.environ.get("TORCH_PJRT_UPSTREAM_TIMEOUT", "300") or 300)
DEVICE = os.environ.get("TORCH_PJRT_UPSTREAM_DEVICE", "")

_out = None
_running = None  # the item whose reports pytest_runtest_logreport collects


def _emit(record):
    global _out
    if not RESULTS:
        return
    if _out is None:
        _out = open(RESULTS, "a", buffering=1)
    _out.write(json.dumps(record) + "\n")
    _out.flush()


_watchdog = None


def _watchdog_file():
    """Where the watchdog writes: a file of its own (``<results>.hung``), not stderr, which
    pytest captures into a temporary file that is lost when the watchdog ends the process. The
    parent reads it to tell a hang from a crash."""
    global _watchdog
    if _watchdog is None:
        _watchdog = open(RESULTS + ".hung", "w") if RESULTS else sys.__stderr__
    return _watchdog


def pytest_configure(config):
    # Exclusions and adaptations must be in place before the test module imports
    # common_device_type's instantiate_device_type_tests, i.e. before collection.
    from torch_pjrt.testing import upstream_compat

    upstream_compat.install(DEVICE)


def pytest_collection_modifyitems(session, config, items):
    done = set()
    if SKIP_IDS and os.path.exists(SKIP_IDS):
        with open(SKIP_IDS) as f:
            done = {line.strip() for line in f if line.strip()}
    keep, drop = [], []
    for item in items:
        nid = upstream_ids.normalize(item.nodeid)
        if nid in done or not upstream_ids.in_sample(nid, FRACTION, SEED):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep
    _emit({"event": "collected", "count": len(keep)})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    nid = upstream_ids.normalize(item.nodeid)
    _emit({"event": "start", "id": nid})
    item._tpj_t0 = time.perf_counter()
    item._tpj_reports = []
    global _running
    _running = item
    m0 = _compile_metrics()
    faulthandler.dump_traceback_later(TIMEOUT, exit=True, file=_watchdog_file())
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
    outcome, message = _combine(item._tpj_reports)
    record = {"event": "end", "id": nid, "outcome": outcome, "message": message,
              "seconds": round(time.perf_counter() - item._tpj_t0, 4)}
    m1 = _compile_metrics()
    if m0 and m1:  # how much of the test's time went into compiling programs
        record["compiles"] = m1[0] - m0[0]
        record["compile_s"] = round((m1[1] - m0[1]) / 1e9, 4)
    _emit(record)


def _compile_metrics():
    if DEVICE == "cpu":
        return None
    import torch

    tpu = getattr(torch, "tpu", None)
    if tpu is None or not hasattr(tpu, "metrics"):
        return None
    m = tpu.metrics()
    return m.get("compiles", 0), m.get("compile_ns", 0)


def _first_line(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message.strip().splitlines()[0] if crash.message.strip() else ""
    if isinstance(report.longrepr, tuple):  # skips: (file, line, reason)
        return str(report.longrepr[2])
    text = str(report.longrepr or "").strip()
    return text.splitlines()[-1] if text else ""


def _combine(reports):
    """One outcome per test: setup and teardown errors count as errors, a failing call as a
    failure; xfail/xpass as unittest reports them (expectedFailure) count as passed/failed."""
    outcome, message = "passed", ""
    for rep in reports:
        if rep.skipped:
            if hasattr(rep, "wasxfail"):
                continue  # an expected failure that failed: counts as passed
            if outcome == "passed":
                outcome, message = "skipped", _first_line(rep)
        elif rep.failed:
            kind = "failed" if rep.when == "call" else "error"
            return kind, _first_line(rep)
    return outcome, message


def pytest_runtest_logreport(report):
    if _running is not None and report.nodeid == _running.nodeid:
        _running._tpj_reports.append(report)
