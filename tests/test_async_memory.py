"""Asynchronous execution, device errors and memory accounting on the tpu device.

(a) Dispatch returns to Python before the device finishes: observed through the runtime's own
    count of executions in flight (torch_pjrt._C.pending_executions).
(b) A failure inside a device program surfaces as a Python exception and leaves the device
    usable (run in a subprocess: a runtime that aborts must fail the test, not kill pytest).
(c) Storages are freed when their last tensor dies; a 1000-step training loop keeps
    torch.tpu.memory_allocated() exactly flat, its RSS flat and compiles nothing new.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import torch_pjrt
from torch_pjrt import _models

TPU = torch.device("tpu")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- (a) asynchrony ----------------------------------------------------------------------------


def test_dispatch_returns_before_device_finishes(fallbacks):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 512, generator=g)
    w = torch.randn(512, 512, generator=g) / 512 ** 0.5  # keeps the chain's scale near 1
    xt, wt = x.to(TPU), w.to(TPU)
    (xt @ wt).cpu()  # compile outside the measured region
    torch.tpu.synchronize()
    assert torch_pjrt._C.pending_executions(0) == 0
    fallbacks.reset()

    t0 = time.perf_counter()
    y = xt
    for _ in range(30):
        y = y @ wt
    t_dispatch = time.perf_counter() - t0
    pending = torch_pjrt._C.pending_executions(0)
    torch.tpu.synchronize()
    t_total = time.perf_counter() - t0
    after = torch_pjrt._C.pending_executions(0)
    print(f"30 matmuls 512x512: dispatch returned after {t_dispatch * 1e3:.1f} ms with {pending} "
          f"executions pending; synchronized after {t_total * 1e3:.1f} ms")

    fallbacks.assert_none("the matmul chain (a CPU fallback runs synchronously)")
    assert pending > 0, (
        f"no execution was pending right after dispatching 30 matmuls (dispatch "
        f"{t_dispatch * 1e3:.1f} ms, total {t_total * 1e3:.1f} ms): execution looks synchronous")
    assert after == 0
    ref = x
    for _ in range(30):
        ref = ref @ w
    torch.testing.assert_close(y.cpu(), ref, rtol=1e-3, atol=1e-3 * ref.abs().max().item())


def test_cpu_copy_waits_for_pending_work():
    """.cpu() right after dispatch (no explicit synchronize) must see the finished values."""
    a = torch.arange(256 * 256, dtype=torch.float32).view(256, 256) / 65536
    t = a.to(TPU)
    for _ in range(20):
        t = t * 1.0001 + 0.5
    ref = a
    for _ in range(20):
        ref = ref * 1.0001 + 0.5
    torch.testing.assert_close(t.cpu(), ref, rtol=1e-6, atol=1e-6)


# --- (b) device errors -------------------------------------------------------------------------

# Each candidate reads a 1-element tensor expanded to 2**34 elements (no memory behind it) and
# reduces it to a small result through an op whose device program needs temporaries as large as
# the input (sort-based selection, ~200 GB), so the failure happens when the device program
# runs, not in the allocator that creates the (small) result storage. Each runs in its own
# subprocess with a timeout. (At 2**40 elements the XLA CPU compiler itself dies with SIGFPE
# while compiling the sort, which no runtime can turn into an exception.)
_ERROR_SCRIPT = textwrap.dedent("""
    import sys, torch
    import torch_pjrt
    fb0 = torch.tpu.metrics()["cpu_fallbacks"]
    x = torch.ones(1, device="tpu").expand(1 << 34)
    stage = "dispatch"
    try:
        y = OP
        stage = "synchronize"
        torch.tpu.synchronize()
        stage = "read"
        y.cpu()
        print("RESULT no-error")
    except Exception as e:
        print("RESULT raised", stage, type(e).__name__, str(e).replace("\\n", " ")[:300])
    print("FALLBACKS", torch.tpu.metrics()["cpu_fallbacks"] - fb0)
    z = torch.arange(4.0, device="tpu") * 2
    torch.tpu.synchronize()
    print("AFTER", z.cpu().tolist())
""")

_ERROR_CANDIDATES = ["x.topk(1).values", "x.median()", "x.kthvalue(1).values"]


def test_device_error_surfaces():
    outcomes = []
    for op in _ERROR_CANDIDATES:
        script = _ERROR_SCRIPT.replace("OP", op)
        try:
            proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                  timeout=60, cwd=REPO)
        except subprocess.TimeoutExpired:
            outcomes.append(f"{op}: ran past 60 s without an error")
            continue
        lines = {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in proc.stdout.splitlines()
                 if ln.split(" ", 1)[0] in ("RESULT", "FALLBACKS", "AFTER")}
        if proc.returncode != 0 or "AFTER" not in lines:
            outcomes.append(f"{op}: process died (rc {proc.returncode}): {proc.stderr[-600:]}")
            continue
        outcomes.append(f"{op}: {lines['RESULT']}; fallbacks {lines['FALLBACKS']}; "
                        f"then {lines['AFTER']}")
        if (lines["RESULT"].startswith("raised") and lines["FALLBACKS"] == "0"
                and lines["AFTER"] == "[0.0, 2.0, 4.0, 6.0]"):
            print("\n".join(outcomes))
            return
    pytest.fail("no candidate produced a device-side error that surfaced in Python with the "
                "device usable afterwards:\n" + "\n".join(outcomes))


# --- (c) memory --------------------------------------------------------------------------------


def test_storage_freed_with_last_tensor():
    torch.tpu.synchronize()
    m0 = torch.tpu.memory_allocated()
    live0 = torch_pjrt._C.live_storages()
    x = torch.empty(1000, device=TPU)
    assert torch.tpu.memory_allocated() == m0 + 4000
    assert torch_pjrt._C.live_storages() == live0 + 1
    v = x[10:].view(2, 495)
    t = v.t()
    del x
    assert torch.tpu.memory_allocated() == m0 + 4000  # views keep the storage alive
    y = t + 1  # a result owns a new storage
    assert torch.tpu.memory_allocated() == m0 + 8000 - 40
    del v, t
    assert torch.tpu.memory_allocated() == m0 + 3960
    del y
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == m0
    assert torch_pjrt._C.live_storages() == live0


def test_intermediates_freed():
    torch.tpu.synchronize()
    m0 = torch.tpu.memory_allocated()
    a = torch.randn(64, 64, device=TPU)
    for _ in range(50):
        a = torch.tanh(a @ a.t() / 64 + 1)
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == m0 + 64 * 64 * 4
    del a
    assert torch.tpu.memory_allocated() == m0


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.long
@pytest.mark.slow
def test_training_memory_flat_1000_steps(fallbacks):
    torch.manual_seed(0)
    data = _models.CharDataset(_models.zen_corpus(), block=16)
    g = torch.Generator().manual_seed(1)
    batches = [data.batch(4, g) for _ in range(1000)]  # made up front: not part of the loop
    model = _models.init_weights(
        _models.TinyGPT(data.vocab, block=16, d=32, heads=2, layers=1), seed=0).to(TPU)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    mem, rss, compiles, losses = [], [], [], []
    t0 = time.perf_counter()
    for x, y in batches:
        x, y = x.to(TPU), y.to(TPU)
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # synchronizes: everything of this step has run
        del x, y, loss
        mem.append(torch.tpu.memory_allocated())
        rss.append(_rss_bytes())
        compiles.append(torch.tpu.metrics()["compiles"])
    elapsed = time.perf_counter() - t0

    mib = 1 << 20
    print(f"1000 steps in {elapsed:.1f} s ({elapsed:.3f} ms/step avg); loss {losses[0]:.3f} -> "
          f"{losses[-1]:.3f}; memory_allocated after step 1: {mem[1]} B, min/max over steps "
          f"1..999: {min(mem[1:])}/{max(mem[1:])}; RSS at step 500 {rss[499] / mib:.1f} MiB, "
          f"max over steps 500..999 {max(rss[499:]) / mib:.1f} MiB, at the end "
          f"{rss[-1] / mib:.1f} MiB; compiles at step 10 {compiles[9]}, at the end {compiles[-1]}; "
          f"CPU fallbacks {fallbacks.delta}")
    assert losses[-1] < losses[0]
    changed = [i for i in range(1, 1000) if mem[i] != mem[1]]
    assert not changed, (
        f"memory_allocated not flat: {len(changed)} steps differ from step 1 ({mem[1]} B), "
        f"first at step {changed[0]}: {mem[changed[0]]} B")
    growth = max(rss[499:]) - rss[499]
    assert growth < 4 * mib, f"RSS grew by {growth / mib:.2f} MiB over the last 500 steps"
    assert compiles[-1] == compiles[499], "new programs compiled in steady state"
