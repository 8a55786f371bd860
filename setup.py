"""Builds the LD_PRELOAD library (src/leaktrace/sources/preload/native/*.c) with the package; the rest of the
package is described in pyproject.toml. The library is an ordinary shared object
that setuptools builds as an extension module, so that pip install builds it."""
from glob import glob

from setuptools import Extension, setup

NATIVE = "src/leaktrace/sources/preload/native"
BPF = "src/leaktrace/sources/bpf"

setup(ext_modules=[Extension(
    "leaktrace.sources.preload._malloc_debug",
    sources=sorted(glob(f"{NATIVE}/*.c")),
    depends=sorted(glob(f"{NATIVE}/*.h")) + [f"{BPF}/layout.h"],
    include_dirs=[NATIVE, BPF],  # cfi.h takes the unwind row from the BPF engine's layout.h
    libraries=["gcc_s", "dl", "pthread"],
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-fvisibility=hidden"],
)])
