"""Builds the native extension with the project's Makefile (csrc/ -> torch_pjrt/_C*.so).

Metadata lives in pyproject.toml. The extension links against the torch that is installed in
the building interpreter, so build without isolation:
    pip install --no-build-isolation -e .
"""

import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))


class BuildWithMake(build_py):
    """Runs `make` before collecting package files, so the freshly built _C*.so is included
    (and, for editable installs, sits next to the sources that the install points at)."""

    def run(self):
        subprocess.check_call(["make", "-j2", f"PYTHON={sys.executable}"], cwd=ROOT)
        super().run()


class BinaryDistribution(Distribution):
    """The wheel carries a compiled extension: tag it for this platform and Python."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithMake}, distclass=BinaryDistribution)
