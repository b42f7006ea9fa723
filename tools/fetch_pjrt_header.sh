#!/usr/bin/env bash
# Puts the PJRT C API headers (0.114) into build/include/ from the pypjrt source distribution on
# PyPI: nothing third-party is committed to this repository. Run by `make` when they are missing.
#   build/include/pjrt_c_api.h                          the PJRT C API
#   build/include/xla/pjrt/c/pjrt_c_api{,_ffi_extension}.h  the plugin's FFI extension (custom-call
#                                                       handlers: csrc/runtime/ffi_kernels.c)
#   build/include/xla/ffi/api/c_api.h                   XLA's FFI C API (the handlers' call frame)
# and build/include/.pjrt-headers, the stamp make depends on.
set -euo pipefail
dest=${1:-build/include}
[ -f "$dest/.pjrt-headers" ] && exit 0
py=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m pip download --quiet --no-deps --no-binary :all: \
  "pypjrt==0.1.1" -d "$tmp" >/dev/null
vendor=pypjrt-0.1.1/vendor/xla
tar -xzf "$tmp"/pypjrt-0.1.1.tar.gz -C "$tmp" "$vendor/pjrt/c/pjrt_c_api.h" \
  "$vendor/pjrt/c/pjrt_c_api_ffi_extension.h" "$vendor/ffi/api/c_api.h"
mkdir -p "$dest/xla/pjrt/c" "$dest/xla/ffi/api"
cp "$tmp/$vendor/pjrt/c/pjrt_c_api.h" "$dest/pjrt_c_api.h"
cp "$tmp/$vendor/pjrt/c/pjrt_c_api.h" "$tmp/$vendor/pjrt/c/pjrt_c_api_ffi_extension.h" \
  "$dest/xla/pjrt/c/"
cp "$tmp/$vendor/ffi/api/c_api.h" "$dest/xla/ffi/api/c_api.h"
grep -q "define PJRT_API_MINOR 114" "$dest/pjrt_c_api.h"
touch "$dest/.pjrt-headers"
