#!/usr/bin/env bash
# Sets up a virtual environment with a pinned torch release, the XLA CPU PJRT plugin and
# torch_pjrt built in place. Idempotent; safe to rerun.
#
#   bash scripts/setup.sh                    # torch 2.13.0 (CPU wheel) in .venv: the default
#   bash scripts/setup.sh --torch 2.14.1     # torch 2.14.1 in .venv-torch2.14.1
#   bash scripts/setup.sh --torch 2.14.1 --venv DIR
#   bash scripts/setup.sh --serving          # also vLLM 0.33.0 (built from its PyPI sdist) and
#                                            # its runtime dependencies: serving on tpu
#
# The release can also come from the environment (TORCH_VERSION); --torch wins. Every
# release gets its own environment, so asking for another release never replaces the torch of
# an existing one: a venv that holds another torch is refused, not reinstalled.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH=${TORCH_VERSION:-2.13.0}
VENV=
SERVING=0
while [ $# -gt 0 ]; do
  case "$1" in
    --torch) TORCH=${2:?--torch needs a release, e.g. 2.14.1}; shift 2 ;;
    --torch=*) TORCH=${1#--torch=}; shift ;;
    --venv) VENV=${2:?--venv needs a directory}; shift 2 ;;
    --venv=*) VENV=${1#--venv=}; shift ;;
    --serving) SERVING=1; shift ;;
    *) echo "setup.sh: unknown argument '$1' (use --torch RELEASE, --venv DIR, --serving)" >&2; exit 2 ;;
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

[ "$SERVING" = 1 ] || exit 0
# --serving: vLLM 0.33.0 from its source distribution (pinned by hash), built into a
# pure-Python wheel with VLLM_TARGET_DEVICE=empty and installed with --no-deps, so its PyPI pins
# (torch==2.14.0, CUDA) never apply; then the runtime dependencies it needs here, by name, under
# constraints that hold this venv's torch, numpy and transformers (requirements-serving*.txt).
PIP=("$VPY" -m pip --disable-pip-version-check)
if [ "$("$VPY" -c "import importlib.metadata as m; print(m.version('vllm'))" 2>/dev/null)" != "0.33.0+empty" ]; then
  # The built wheel is kept per user, under a name holding the digest of the pinned
  # requirement (version and sdist hash): a later setup (another checkout, CI's fresh clone)
  # installs it instead of building it again (about a minute).
  PIN=$(sha256sum requirements-serving-vllm.txt | cut -c1-16)
  WHEELS=${XDG_CACHE_HOME:-$HOME/.cache}/torch_pjrt/serving-wheels/$PIN
  "${PIP[@]}" install --quiet -r requirements-serving-build.txt  # also jinja2, packaging: run time
  if ! ls "$WHEELS"/vllm-0.33.0+empty-*.whl >/dev/null 2>&1; then
    rm -rf "$WHEELS.tmp" && mkdir -p "$WHEELS.tmp"
    VLLM_TARGET_DEVICE=empty "${PIP[@]}" wheel --quiet --no-deps --no-build-isolation \
      --require-hashes -r requirements-serving-vllm.txt -w "$WHEELS.tmp"
    rm -rf "$WHEELS" && mv "$WHEELS.tmp" "$WHEELS"
  fi
  "${PIP[@]}" install --quiet --no-deps "$WHEELS"/vllm-0.33.0+empty-*.whl
fi
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS"' EXIT
"$VPY" - > "$CONSTRAINTS" <<'PYEOF'
import importlib.metadata as m
import torch
print("torch==" + torch.__version__.split("+")[0])
print("numpy==" + m.version("numpy"))
print("transformers==5.24.0")
PYEOF
"${PIP[@]}" install --quiet -r requirements-serving.txt --constraint "$CONSTRAINTS"
"${PIP[@]}" install --quiet --no-deps -r requirements-serving-nodeps.txt
# The plugin is part of torch_pjrt (entry point vllm.platform_plugins, installed above).
"$VPY" -c "
import torch, vllm
from vllm.platforms import current_platform
assert current_platform.device_type == 'tpu', current_platform
print('vllm', vllm.__version__, '| platform:', type(current_platform).__name__, '| torch', torch.__version__)"
