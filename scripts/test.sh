#!/usr/bin/env bash
# Sets up (scripts/setup.sh, then the test-only packages of requirements-test.txt) and runs every
# test: the C unit tests (plain and under AddressSanitizer) and the Python test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# test-only dependencies; torch stays the one setup.sh pinned (--constraint makes that explicit)
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-test.txt \
  --constraint <(.venv/bin/python -c "import torch; print('torch==' + torch.__version__.split('+')[0])")
make -j2 PYTHON=.venv/bin/python ctest
make -j2 PYTHON=.venv/bin/python ctest-asan
# `--long`: only the multi-process suites marked `long` (too long for CI's budget; their results
# are in docs/distributed.md); otherwise everything else. Other arguments go to pytest.
if [ "${1:-}" = "--long" ]; then
  shift
  .venv/bin/python -m pytest -q tests -m long "$@"
else
  .venv/bin/python -m pytest -q tests -m "not long" "$@"
fi
