#!/usr/bin/env bash
# torch_pjrt on an NVIDIA GPU through the CUDA PJRT plugin (jax-cuda13-pjrt or jax-cuda12-pjrt),
# with the interpreter's own torch: builds the extension, runs the main job, the matrix-product
# benchmark and the Python suite (what fits in PYTEST_SECONDS). OUTDIR gets six files (the device
# tool returns at most eight): summary.txt (versions, the main job, the benchmark, the suite's
# counts), build.log, pytest.log, pytest_failed.txt, pytest_failures.log (each failure's report,
# written as it happens) and crashes.log (tests that crashed their worker, run again alone).
#   bash scripts/gpu_check.sh OUTDIR
# Knobs: PYTEST_SECONDS (the suite's share, 270), GPU_CHECK_SECONDS (no crash reruns start after
# this, 520; the device tool stops a command at 600), CRASH_FIRST (a file of test ids to rerun
# alone before the suite), PYTEST_WORKERS (12).
# Needs: build/include/ (the PJRT headers; `make` fetches them where pip reaches PyPI), a C
# compiler, torch, pytest, pytest-xdist and pytest-timeout in $PYTHON (default python3).
# Not part of CI (CI has no GPU); the last run's figures are in docs/plugins.md.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash scripts/gpu_check.sh OUTDIR}
mkdir -p "$out"
PY=${PYTHON:-python3}
# The device tool allows 600 s a command: reruns of crashed tests stop at this many seconds.
deadline=${GPU_CHECK_SECONDS:-520}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} TORCH_PJRT_PLUGIN=cuda
export TORCH_PJRT_CACHE_DIR=${TORCH_PJRT_CACHE_DIR:-/tmp/torch_pjrt_gpu_cache}
{
  nvidia-smi -L
  "$PY" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)"
  "$PY" -m pip list 2>/dev/null | grep -i -E "^(jax|pytest)"
} 2>&1 | tee "$out/summary.txt"
start=$SECONDS
if ! make -j"$(nproc)" PYTHON="$PY" > "$out/build.log" 2>&1; then
  tail -60 "$out/build.log"
  exit 1
fi
echo "build: $((SECONDS - start)) s" | tee -a "$out/summary.txt"
# the entry points (torch.compile's backend="tpu", autoload); make above already built _C
"$PY" -m pip install -q --no-deps --no-build-isolation -e . >> "$out/build.log" 2>&1 || tail -5 "$out/build.log"
"$PY" -c "import torch, torch_pjrt; print(torch.tpu.get_device_name(), torch.tpu.device_count(),
      'memory (free, total):', torch.tpu.mem_get_info())" 2>&1 | tee -a "$out/summary.txt"
timeout 150 "$PY" examples/train_gpt.py --steps 100 2>&1 | tee -a "$out/summary.txt"
timeout 150 "$PY" benchmarks/bench_plugin_matmul.py 2>&1 | tee -a "$out/summary.txt"
# Reruns the tests named on stdin one process each into crashes.log, with scripts/segv_where.c
# preloaded (the machine has no gdb): the faulting instruction's library and symbol.
cc -shared -fPIC -O1 -o /tmp/segv_where.so scripts/segv_where.c -ldl || echo "segv_where: cc failed"
rerun_crashed() {
  local t left
  while read -r t; do
    left=$((deadline - SECONDS))
    if (( left < 15 )); then echo "==== $t: not rerun (time)" >> "$out/crashes.log"; continue; fi
    echo "==== $t" >> "$out/crashes.log"
    LD_PRELOAD=/tmp/segv_where.so timeout $((left < 90 ? left : 90)) "$PY" -m pytest -q \
      -p no:cacheprovider -p no:xdist -p no:faulthandler "$t" >> "$out/crashes.log" 2>&1
    echo "rc=$?" >> "$out/crashes.log"
  done
}
# CRASH_FIRST: a file of test ids known to crash, rerun before the suite.
if [[ -n "${CRASH_FIRST:-}" ]]; then rerun_crashed < "$CRASH_FIRST"; fi
start=$SECONDS
TORCH_PJRT_FAIL_LOG=$out/pytest_failures.log timeout "${PYTEST_SECONDS:-270}" "$PY" -m pytest -v -n "${PYTEST_WORKERS:-12}" tests \
  -m "not long" --ignore-glob='tests/test_serving_vllm*.py' -p no:cacheprovider \
  $("$PY" -c "import pytest_timeout" 2>/dev/null && echo --timeout 120) > "$out/pytest.log" 2>&1
echo "pytest rc=$? after $((SECONDS - start)) s" | tee -a "$out/summary.txt"
for what in PASSED FAILED ERROR SKIPPED XFAIL XPASS; do
  printf '%s %s\n' "$what" "$(grep -c " $what " "$out/pytest.log")"
done | tee -a "$out/summary.txt"
grep -E " (FAILED|ERROR) " "$out/pytest.log" | sed 's/^\[gw[0-9]*\] *\[ *[0-9]*%\] *//' \
  | sort | head -300 > "$out/pytest_failed.txt"
tail -5 "$out/pytest.log"
# Tests that crashed their worker (an abort or a signal, no Python exception: a bug by this
# project's rules) again, one process each, for the plugin's own last words and the crash's
# native location (the worker's stderr is lost under xdist). xdist names a crashed test in its
# final summary and, as it happens, on the line after "node down" (the summary is missing when
# the timeout stops pytest).
{ grep -o "crashed while running '[^']*'" "$out/pytest.log" | sed "s/.*running '//; s/'$//"
  grep -A1 "node down" "$out/pytest.log" | grep -o "FAILED [^ ]*" | sed 's/^FAILED //'
} | sort -u | head -"${CRASH_RERUNS:-12}" > /tmp/gpu_check_crashed.txt
rerun_crashed < /tmp/gpu_check_crashed.txt
echo "crashed workers: $(wc -l < /tmp/gpu_check_crashed.txt) (rerun one by one into crashes.log)" \
  | tee -a "$out/summary.txt"
