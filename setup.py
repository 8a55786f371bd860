"""Builds the LD_PRELOAD library (preload/malloc_debug.c) with the package; the rest of
the package is described in pyproject.toml. The library is an ordinary shared object
that setuptools builds as an extension module, so that pip install builds it."""
from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "leaktrace._malloc_debug",
    sources=["preload/malloc_debug.c"],
    depends=["preload/options.h"],
    include_dirs=["preload"],
    libraries=["gcc_s", "dl", "pthread"],
    extra_compile_args=["-O2", "-Wall", "-Wextra"],
)])
