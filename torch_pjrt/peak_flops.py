"""The peak arithmetic rate of a tpu device, for MFU that means something.

Frameworks compute MFU against a table of published chip peaks (torchtitan's
``get_peak_flops`` in torchtitan/tools/utils.py keys it by the device name and falls back to an
A100's 312 TFLOP/s for names it does not know, such as the CPU plugin's ``cpu``). This module
gives the figure for the chip the plugin reports:

- **TPUs and GPUs**: the published dense bfloat16 peak per device of the device kind the
  plugin reports (``_PUBLISHED``; TPU v7 shows each of its two TensorCores as a device).
- **The CPU plugin**: cores x floating-point operations per cycle x clock, read from the host:
  the cores this process may run on (``os.sched_getaffinity``, shared by every device the
  plugin creates: the devices of one process, and the processes of one machine, divide one
  peak), the clock from ``/proc/cpuinfo`` (``cpu MHz``: in a VM the nominal clock) or, when
  higher, the clock a measured float32 matmul implies (turbo), and the
  operations per cycle from the instruction sets it lists. float32: 2 FMA units x vector lanes
  x 2 (AVX-512: 16 lanes, AVX2: 8). bfloat16 matrix products: with AMX, 1,024 per cycle (one
  tile multiply of 16 x 32 bfloat16 pairs per cycle); else with AVX512_BF16, twice float32;
  else float32's. Two FMA units is an assumption (server cores of both vendors have them); the
  result says so.

``peak_flops(dtype)`` returns ``(flops per second, explanation)``; both go into reports next
to the MFU computed from them.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

# Published dense bfloat16 peak per device (FLOP/s), by a substring of the device kind.
# Order matters: the first match wins ("v5 lite" before "v5").
_PUBLISHED = (
    ("TPU v7", 2307e12 / 2, "TPU v7: 2,307 TFLOP/s per chip, two TensorCores shown as devices"),
    ("TPU v6 lite", 918e12, "TPU v6e (Trillium): 918 TFLOP/s"),
    ("TPU v5 lite", 197e12, "TPU v5e: 197 TFLOP/s"),
    ("TPU v5p", 459e12, "TPU v5p: 459 TFLOP/s"),
    ("TPU v5", 459e12, "TPU v5p: 459 TFLOP/s"),
    ("TPU v4", 275e12, "TPU v4: 275 TFLOP/s"),
    ("H200", 989e12, "NVIDIA H200 SXM: 989 TFLOP/s dense bf16"),
    ("H100", 989e12, "NVIDIA H100 SXM: 989 TFLOP/s dense bf16"),
    ("A100", 312e12, "NVIDIA A100: 312 TFLOP/s dense bf16"),
    ("B200", 2250e12, "NVIDIA B200: 2,250 TFLOP/s dense bf16"),
)


def _cpuinfo() -> dict:
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if ":" in line:
                    k, v = line.split(":", 1)
                    info.setdefault(k.strip(), v.strip())
    except OSError:
        pass
    return info


_measured_ghz: Optional[float] = None


def _clock_from_fp32_matmul(cores: int, fp32_per_cycle: int) -> float:
    """The clock a float32 matrix product on the host's cores implies (GHz): PyTorch's CPU
    matmul reaches close to the vector units' peak, so rate / (cores x operations per cycle)
    is a lower bound of the clock the cores really run at (a VM's /proc/cpuinfo shows the
    nominal clock, turbo unseen). Measured once per process (~0.5 s)."""
    global _measured_ghz
    if _measured_ghz is None:
        import time

        a = torch.randn(2048, 2048)
        b = torch.randn(2048, 2048)
        a @ b
        best = float("inf")
        for _ in range(6):
            t = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t)
        _measured_ghz = 2 * 2048 ** 3 / best / (cores * fp32_per_cycle) / 1e9
    return _measured_ghz


def cpu_peak(dtype: torch.dtype = torch.bfloat16, cpuinfo: Optional[dict] = None,
             cores: Optional[int] = None, measure: bool = False) -> tuple[float, str]:
    """``measure``: take the clock as the larger of /proc/cpuinfo's and the one a float32
    matmul implies (see _clock_from_fp32_matmul)."""
    info = _cpuinfo() if cpuinfo is None else cpuinfo
    flags = set(info.get("flags", "").split())
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        ghz = float(info.get("cpu MHz", "0")) / 1000
    except ValueError:
        ghz = 0.0
    lanes = 16 if "avx512f" in flags else 8 if "avx2" in flags else 4
    fp32 = 2 * lanes * 2  # two FMA units, an FMA is two operations
    isa = "AVX-512" if lanes == 16 else "AVX2" if lanes == 8 else "SSE"
    clock_from = "/proc/cpuinfo"
    if measure:
        implied = _clock_from_fp32_matmul(cores, fp32)
        if implied > ghz:
            ghz, clock_from = implied, "implied by a measured float32 matmul; /proc/cpuinfo says less"
    if ghz <= 0:
        return 0.0, "clock unknown (no 'cpu MHz' in /proc/cpuinfo)"
    if dtype == torch.bfloat16 and "amx_bf16" in flags:
        per_cycle, how = 1024, "AMX bf16 (1,024/cycle)"
    elif dtype == torch.bfloat16 and "avx512_bf16" in flags:
        per_cycle, how = 2 * fp32, f"AVX512_BF16 ({2 * fp32}/cycle)"
    else:
        per_cycle, how = fp32, f"{isa} float32, 2 FMA units ({fp32}/cycle)"
    peak = cores * per_cycle * ghz * 1e9
    name = info.get("model name", "CPU")
    return peak, (f"{name}: {cores} cores x {how} x {ghz:.2f} GHz = {peak / 1e9:,.0f} GFLOP/s "
                  f"({str(dtype).replace('torch.', '')}; clock {clock_from})")


def peak_flops(dtype: torch.dtype = torch.bfloat16, device=None) -> tuple[float, str]:
    """Peak FLOP/s of one tpu device for matrix products in ``dtype``, and how it was found.
    For the CPU plugin, the machine's peak: its devices share the host's cores."""
    kind = ""
    try:
        kind = torch.tpu.get_device_name(device)
    except Exception:  # noqa: BLE001 - no device: the host's figure is still useful
        kind = "cpu"
    for key, flops, how in _PUBLISHED:
        if key.lower() in kind.lower():
            return flops, f"{how} (published, device kind {kind!r})"
    if kind.lower() == "cpu":
        return cpu_peak(dtype, measure=True)
    return 0.0, f"no peak known for device kind {kind!r}"
