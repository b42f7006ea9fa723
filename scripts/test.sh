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
.venv/bin/python -m pytest -q tests "$@"
