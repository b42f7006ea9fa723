#!/usr/bin/env bash
# Puts the PJRT C API header (0.114) into build/include/ from the pypjrt source distribution on
# PyPI: nothing third-party is committed to this repository. Run by `make` when it is missing.
set -euo pipefail
dest=${1:-build/include}
[ -f "$dest/pjrt_c_api.h" ] && exit 0
py=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m pip download --quiet --no-deps --no-binary :all: \
  "pypjrt==0.1.1" -d "$tmp" >/dev/null
tar -xzf "$tmp"/pypjrt-0.1.1.tar.gz -C "$tmp" pypjrt-0.1.1/vendor/xla/pjrt/c/pjrt_c_api.h
mkdir -p "$dest"
cp "$tmp"/pypjrt-0.1.1/vendor/xla/pjrt/c/pjrt_c_api.h "$dest/pjrt_c_api.h"
grep -q "define PJRT_API_MINOR 114" "$dest/pjrt_c_api.h"
