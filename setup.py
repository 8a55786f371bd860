"""Builds the LD_PRELOAD library (preload/*.c) with the package; the rest of the
package is described in pyproject.toml. The library is an ordinary shared object
that setuptools builds as an extension module, so that pip install builds it."""
from glob import glob

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "leaktrace._malloc_debug",
    sources=sorted(glob("preload/*.c")),
    depends=sorted(glob("preload/*.h")),
    include_dirs=["preload"],
    libraries=["gcc_s", "dl", "pthread"],
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-fvisibility=hidden"],
)])
