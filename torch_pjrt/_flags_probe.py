"""Checks XLA_FLAGS / LIBTPU_INIT_ARGS in a child process before this process starts the plugin.

An XLA plugin parses these variables when its client starts and aborts the whole process on a
flag it does not know (``F... parse_flags_from_env.cc] Unknown flag in XLA_FLAGS: --x``): nothing
a Python caller could catch. So when either variable is set, a child process starts the same
plugin first; if the child dies with that complaint, the device is disabled with the plugin's
own line as the reason (``torch.tpu.is_available()`` is False, creating a tpu tensor raises
RuntimeError), and the process lives.

The verdict "these flags are accepted" is remembered in the compile cache directory, keyed by
the plugin file and the variables' values, so the child runs once per flag set, not per process.
A child that fails for another reason (a TPU held by another process, a timeout) decides nothing:
the real start then reports its own error.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from typing import Optional

VARIABLES = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")
# set in the child, so its own import does not probe again
_IN_CHILD = "TORCH_PJRT_FLAGS_PROBE_CHILD"
_TIMEOUT_S = 300
_CHILD = "import torch, torch_pjrt; n = torch.tpu.device_count(); raise SystemExit(0 if n else 3)"
# what the flag parser writes before it aborts
_COMPLAINTS = ("Unknown flag", "parse_flags_from_env", "Unknown command line flag")


def _key(plugin_path: str) -> str:
    h = hashlib.sha256(os.path.realpath(plugin_path).encode())
    try:
        st = os.stat(plugin_path)
        h.update(f"|{st.st_size}|{st.st_mtime_ns}".encode())
    except OSError:
        pass
    for v in VARIABLES:
        h.update(f"|{v}={os.environ.get(v, '')}".encode())
    return h.hexdigest()[:32]


def _marker(cache_dir: str, plugin_path: str) -> Optional[str]:
    return os.path.join(cache_dir, "flags-ok", _key(plugin_path)) if cache_dir else None


def rejected(plugin_path: str, cache_dir: str, readonly: bool = False) -> Optional[str]:
    """The plugin's complaint when it would abort on this environment's flags, else None."""
    if os.environ.get(_IN_CHILD) or not any(os.environ.get(v, "").strip() for v in VARIABLES):
        return None
    marker = _marker(cache_dir, plugin_path)
    if marker and os.path.exists(marker):
        return None
    env = {**os.environ, _IN_CHILD: "1"}
    try:
        child = subprocess.run([sys.executable, "-c", _CHILD], env=env, stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    if child.returncode == 0:
        if marker and not readonly:  # TORCH_PJRT_CACHE_READONLY: nothing is written
            try:
                # private, as the compile cache creates it (csrc/runtime/disk_cache.c)
                os.makedirs(cache_dir, mode=0o700, exist_ok=True)
                os.makedirs(os.path.dirname(marker), mode=0o700, exist_ok=True)
                with open(marker, "w"):
                    pass
            except OSError:  # an unusable cache directory only costs the probe next time
                pass
        return None
    lines = [ln.strip() for ln in child.stderr.splitlines()
             if any(c in ln for c in _COMPLAINTS)]
    if not lines:
        return None
    # "F0000 00:00:... parse_flags_from_env.cc:234] Unknown flag in XLA_FLAGS: --x": the text
    # after the log prefix
    said = lines[-1].split("] ", 1)[-1]
    return (f"the PJRT plugin {plugin_path} rejects the flags in the environment, and would abort "
            f"the process when it starts: {said}. Fix or unset "
            f"{' / '.join(v for v in VARIABLES if os.environ.get(v, '').strip())}.")
