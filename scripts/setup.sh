#!/usr/bin/env bash
# Sets up a virtual environment in .venv with torch 2.13.0 (CPU wheel), the XLA CPU PJRT plugin
# and torch_pjrt built in place. Idempotent; safe to rerun.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
# torch first and pinned, so nothing below can pull another torch build. expecttest: needed by
# torch.testing._internal (the OpInfo database the conformance harness reads).
"$VPY" -m pip install --quiet --disable-pip-version-check "torch==2.13.0" numpy pytest expecttest
# --no-deps: the plugin wheel declares jax, which the C plugin itself does not need.
"$VPY" -m pip install --quiet --disable-pip-version-check --no-deps -r requirements.txt
# --no-build-isolation: the build uses the torch installed above (never a resolved one).
"$VPY" -m pip install --quiet --disable-pip-version-check --no-build-isolation --no-deps -e .
"$VPY" -c "import torch; assert torch.tpu.is_available(), torch.tpu.diagnostics(); print('torch', torch.__version__, '| tpu device:', torch.tpu.get_device_name())"
