#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs every test: the C unit tests (plain and under
# AddressSanitizer) and the Python test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
make -j2 PYTHON=.venv/bin/python ctest
make -j2 PYTHON=.venv/bin/python ctest-asan
.venv/bin/python -m pytest -q tests "$@"
