#!/usr/bin/env bash
# Sets up a virtual environment with a pinned torch release, the XLA CPU PJRT plugin and
# torch_pjrt built in place. Idempotent; safe to rerun.
#
#   bash scripts/setup.sh                    # torch 2.13.0 (CPU wheel) in .venv: the default
#   bash scripts/setup.sh --torch 2.14.1     # torch 2.14.1 in .venv-torch2.14.1
#   bash scripts/setup.sh --torch 2.14.1 --venv DIR
#
# The release can also come from the environment (TORCH_VERSION); --torch wins. Every
# release gets its own environment, so asking for another release never replaces the torch of
# an existing one: a venv that holds another torch is refused, not reinstalled.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH=${TORCH_VERSION:-2.13.0}
VENV=
while [ $# -gt 0 ]; do
  case "$1" in
    --torch) TORCH=${2:?--torch needs a release, e.g. 2.14.1}; shift 2 ;;
    --torch=*) TORCH=${1#--torch=}; shift ;;
    --venv) VENV=${2:?--venv needs a directory}; shift 2 ;;
    --venv=*) VENV=${1#--venv=}; shift ;;
    *) echo "setup.sh: unknown argument '$1' (use --torch RELEASE, --venv DIR)" >&2; exit 2 ;;
  esac
done
# The releases this project builds and is tested with, and what goes beside each one.
#  2.13.0: the CPU wheel. No torchvision: PyPI's builds (0.28.0, its companion, and 0.29.x)
#          are linked against CUDA torch and fail to import beside it ("operator
#          torchvision::nms does not exist"), and nothing here needs one.
#  2.14.1: a CUDA build (~5.5 GB in the venv; it runs on the CPU), with its torchvision 0.29.1.
case "$TORCH" in
  2.13.0) EXTRA=() ;;
  2.14.1) EXTRA=("torchvision==0.29.1") ;;
  *) echo "setup.sh: torch $TORCH is not a supported release (2.13.0, 2.14.1)" >&2; exit 2 ;;
esac
if [ -z "$VENV" ]; then
  if [ "$TORCH" = 2.13.0 ]; then VENV=.venv; else VENV=.venv-torch$TORCH; fi
fi
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
VPY=$VENV/bin/python
HAVE=$("$VPY" -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null || true)
if [ -n "$HAVE" ] && [ "$HAVE" != "$TORCH" ]; then
  echo "setup.sh: $VENV holds torch $HAVE, not $TORCH; pick another --venv (or remove $VENV)" >&2
  exit 2
fi
# torch first and pinned, so nothing below can pull another torch build. expecttest: needed by
# torch.testing._internal (the OpInfo database the conformance harness reads).
"$VPY" -m pip install --quiet --disable-pip-version-check "torch==$TORCH" ${EXTRA[@]+"${EXTRA[@]}"} \
  numpy pytest expecttest
# --no-deps: the plugin wheel declares jax, which the C plugin itself does not need.
"$VPY" -m pip install --quiet --disable-pip-version-check --no-deps -r requirements.txt
# --no-build-isolation: the build uses the torch installed above (never a resolved one). The
# extension is built in place (torch_pjrt/_C*.so) for this venv's torch; setup.py fails the
# install when the build fails.
"$VPY" -m pip install --quiet --disable-pip-version-check --no-build-isolation --no-deps -e .
"$VPY" -c "import torch; assert torch.tpu.is_available(), torch.tpu.diagnostics(); print('torch', torch.__version__, '| tpu device:', torch.tpu.get_device_name())"
