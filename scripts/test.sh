#!/usr/bin/env bash
# Sets up (scripts/setup.sh, then the test-only packages of requirements-test.txt) and runs every
# test: the C unit tests (plain and under AddressSanitizer) and the Python test suite.
# `--torch RELEASE` first (e.g. --torch 2.14.1; or TORCH_VERSION): the same on that release, in
# the venv scripts/setup.sh keeps for it (.venv-torchRELEASE); by default torch 2.13.0 in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
# elapsed() prints how long the script has run (CI's 35-minute budget: which phase costs what)
elapsed() { echo "[test.sh] $1 after $((SECONDS / 60)) min $((SECONDS % 60)) s"; }
# The runs below share the cores (three side by side, then two pytest workers), more threads
# than cores: PyTorch's CPU kernels' OpenMP threads then wait passively at the end of a parallel
# region instead of spinning through the scheduler slice another process needs. Measured with
# other jobs on both cores: PyTorch's test_reductions.py (5% sample, warm caches) 147-200 s
# spinning, 81-82 s passive. A value set by the caller is kept.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
TORCH=${TORCH_VERSION:-2.13.0}
if [ "${1:-}" = "--torch" ]; then
  TORCH=${2:?--torch needs a release, e.g. 2.14.1}
  shift 2
fi
# setup.sh's venv for that release (its default for --torch without --venv)
if [ "$TORCH" = 2.13.0 ]; then VENV=.venv; else VENV=.venv-torch$TORCH; fi
# `--serving`: only the serving tests (tests/test_serving_vllm*.py: the vLLM plugin on tpu,
# docs/serving.md), all of them, the `long` ones included (tensor parallelism, restarts,
# windowed models, speculative decoding, a second `vllm serve`).
if [ "${1:-}" = "--serving" ]; then
  shift
  bash scripts/setup.sh --torch "$TORCH" --serving
  exec "$VENV/bin/python" -m pytest -q tests/test_serving_vllm.py tests/test_serving_vllm_*.py "$@"
fi
# The default release also gets vLLM (setup.sh --serving), so that the suite below runs the
# serving tests that are not `long`; other releases run without it (those tests skip).
SERVING=()
if [ "$TORCH" = 2.13.0 ]; then SERVING=(--serving); fi
bash scripts/setup.sh --torch "$TORCH" "${SERVING[@]}"
VPY=$VENV/bin/python
# test-only dependencies; torch stays the one setup.sh pinned (--constraint makes that explicit)
"$VPY" -m pip install --quiet --disable-pip-version-check -r requirements-test.txt \
  --constraint <("$VPY" -c "import torch; print('torch==' + torch.__version__.split('+')[0])")
"$VPY" -m pip install --quiet --disable-pip-version-check --no-deps -r requirements-test-nodeps.txt
elapsed "set up"
make -j2 PYTHON="$VPY" ctest
elapsed "C tests"
# `--long`: only the tests marked `long` (the slowest multi-process, cache and model-zoo runs,
# outside CI's 35-minute budget, and the TorchTitan run, which needs torchtitan installed aside:
# docs/distributed.md); otherwise everything else. Other arguments go to pytest.
# The suite runs on PYTEST_WORKERS worker processes (pytest-xdist; default 2, 0 = in this one).
# --dist worksteal: a worker that runs out of tests takes pending ones from the other's queue, so
# a file of long tests (test_dist_threads, the compile-cache files) queued on one worker near the
# end does not leave the other core idle.
WORKERS=(-n "${PYTEST_WORKERS:-2}" --dist worksteal)
# The serving tests (vLLM engines and `vllm serve` processes; they skip without vLLM) never run
# in the worker pool: in one process of their own their module-scoped engines are built once,
# and they do not compete with the rest for the two cores (in the pool they cost about twice
# their time). Their `long` ones run with `--serving`.
SERVING_TESTS=(tests/test_serving_vllm.py tests/test_serving_vllm_*.py)
if [ "${1:-}" = "--long" ]; then
  shift
  exec "$VPY" -m pytest -q tests -m long --ignore-glob='tests/test_serving_vllm*.py' \
    "${WORKERS[@]}" "$@"
fi
# `--upstream`: PyTorch's own device-generic tests, every file of ../shared/upstream-tests
# (seeded samples of the large ones), tpu against CPU; rewrites docs/upstream-tests.md.
if [ "${1:-}" = "--upstream" ]; then
  shift
  exec "$VPY" -m torch_pjrt.testing.upstream --suite docs --markdown docs/upstream-tests.md \
    --json build/upstream-docs.json "$@"
fi
# Every run below always happens, and the script fails when any failed.
# First three runs side by side, each writing its own log, shown when all three are done (in a
# fresh clone, program caches cold, they took 8 min 39 s together on the 2-core development
# machine; one after the other, caches warm, 2:44 + 3:05 + 2:55):
# - the C tests under AddressSanitizer (an instrumented build, then the tests in turn);
# - the serving tests (one process: its module-scoped vLLM engines are built once);
# - PyTorch's own tests, CI's subset (docs/upstream-tests.md): fails when a file's count of tpu
#   tests passing (of those passing on CPU) drops below tests/upstream_baseline.json, or a file
#   crashes or hangs (its per-test watchdog, 300 s, is far above any test's time under load).
status=0
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
declare -A PIDS
make -j2 PYTHON="$VPY" ctest-asan > "$LOGS/ctest-asan" 2>&1 & PIDS[ctest-asan]=$!
"$VPY" -m pytest -q "${SERVING_TESTS[@]}" -m "not long" "$@" > "$LOGS/serving" 2>&1 &
PIDS[serving]=$!
"$VPY" -m torch_pjrt.testing.upstream --suite ci --check-against tests/upstream_baseline.json \
  --markdown build/upstream-ci.md > "$LOGS/upstream" 2>&1 & PIDS[upstream]=$!
for name in ctest-asan serving upstream; do
  rc=0; wait "${PIDS[$name]}" || rc=$?
  echo "== $name (exit $rc)"; cat "$LOGS/$name"
  [ "$rc" = 0 ] || status=$rc
done
elapsed "ASan C tests, serving tests, upstream subset"
# Then the Python suite on the worker pool.
"$VPY" -m pytest -q tests -m "not long" --ignore-glob='tests/test_serving_vllm*.py' \
  "${WORKERS[@]}" "$@" || status=$?
elapsed "Python suite"
exit "$status"
