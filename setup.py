"""Builds the native extension with the project's Makefile (csrc/ -> torch_pjrt/_C*.so).

Metadata lives in pyproject.toml. The extension links against the torch that is installed in
the building interpreter, so build without isolation:
    pip install --no-build-isolation -e .
"""

import glob
import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.dist import Distribution
from setuptools.errors import CompileError

ROOT = os.path.dirname(os.path.abspath(__file__))


class BuildWithMake(build_ext):
    """Runs `make`, which builds torch_pjrt/_C*.so in place.

    This is the build_ext step, not build_py: setuptools' editable install runs a customized
    build_py under a catch-all that turns its failure into a warning (and pip then reports
    "Successfully installed" with no extension), whereas a failing build_ext fails the install.
    make's own output, the compiler's errors included, goes straight to the console."""

    def run(self):
        try:
            subprocess.run(["make", "-j2", f"PYTHON={sys.executable}"], cwd=ROOT, check=True)
        except subprocess.CalledProcessError as e:
            raise CompileError(
                f"building torch_pjrt/_C failed: make exited with status {e.returncode} "
                "(its errors are above)"
            ) from None
        self._outputs = []
        if self.inplace or getattr(self, "editable_mode", False):
            return  # the source tree is the installed package: the library is already there
        # A regular wheel: build_py ran first and may have copied an older library; this one wins.
        dest = os.path.join(self.build_lib, "torch_pjrt")
        os.makedirs(dest, exist_ok=True)
        for so in glob.glob(os.path.join(ROOT, "torch_pjrt", "_C*.so")):
            self.copy_file(so, dest)
            self._outputs.append(os.path.join(dest, os.path.basename(so)))

    def get_outputs(self):
        return list(getattr(self, "_outputs", []))


class BinaryDistribution(Distribution):
    """The wheel carries a compiled extension: tag it for this platform and Python (and run
    build_ext, which only runs for distributions with extension modules)."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_ext": BuildWithMake}, distclass=BinaryDistribution)
