"""Builds the LD_PRELOAD library (src/leaktrace/sources/preload/native/*.c, with the Python walk
of interpreters/python/) and the CFI module
(src/leaktrace/unwind/cfi.c, in the library too) with the package; the rest of the package is
described in pyproject.toml. Both are ordinary shared objects that setuptools builds as extension
modules, so that pip install builds them."""
import runpy
from glob import glob
from pathlib import Path

import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py


class build_py_with_web_assets(build_py):
    """The HTML page's flame graph library, fetched into the package before it is copied (a
    wheel built from a clean checkout writes --html pages); nothing is fetched when present."""

    def run(self):
        assets = runpy.run_path(str(Path(__file__).parent / "scripts" / "web_assets.py"))
        assets["fetch"](assets["DEFAULT_DIRECTORY"])
        super().run()


class build_ext_with_musl_library(build_ext):
    """The preload library again, for programs on musl (musl-gcc, from musl-tools), beside the
    glibc one: a program's loader takes only a library built for its libc. Without musl-gcc
    there is none, and leaktrace refuses a musl program in-process in one line."""

    def run(self):
        super().run()
        compiler = shutil.which("musl-gcc")
        library = self.extensions[0]
        target = Path(self.get_ext_fullpath(library.name)).with_name(MUSL_LIBRARY)
        if compiler is None:
            print(f"setup.py: musl-gcc not found: {MUSL_LIBRARY} not built (musl programs are refused in-process)")
            return
        includes = [f"-I{d}" for d in library.include_dirs]
        subprocess.run(
            [compiler, *FLAGS, "-fPIC", "-shared", *includes, *library.sources, "-Wl,-Bsymbolic-functions",
             "-Wl,--eh-frame-hdr", "-o", str(target)],  # musl-gcc's specs leave the header out
            check=True,
        )


MUSL_LIBRARY = "malloc_debug_musl.so"
NATIVE = "src/leaktrace/sources/preload/native"
ABI = "src/leaktrace/abi"
UNWIND = "src/leaktrace/unwind"
PYTHON = "src/leaktrace/interpreters/python"
INTERPRETERS = "src/leaktrace/interpreters"
ALLOCATORS = "src/leaktrace/allocators"
PLATFORM = "src/leaktrace/platform"

FLAGS = ["-O2", "-Wall", "-Wextra", "-fvisibility=hidden"]
CFI = [f"{UNWIND}/cfi.h", f"{UNWIND}/rows.h", f"{ABI}/user_types.h", f"{PLATFORM}/arch.h"]  # the CFI interpreter both engines use, and its rows

setup(cmdclass={"build_py": build_py_with_web_assets, "build_ext": build_ext_with_musl_library}, ext_modules=[
    Extension(
        "leaktrace.sources.preload._malloc_debug",
        sources=sorted(glob(f"{NATIVE}/*.c")) + [f"{UNWIND}/cfi.c", f"{PYTHON}/python_stack.c"],
        depends=sorted(glob(f"{NATIVE}/*.h"))
        + CFI
        + [f"{ABI}/layout.h", f"{ABI}/record.h", f"{ALLOCATORS}/allocators.h", f"{PYTHON}/python_frames.h", f"{PYTHON}/python_versions.h"]
        + [f"{PYTHON}/python_stack.h", f"{INTERPRETERS}/interpreter_host.h", f"{INTERPRETERS}/interpreter_stacks.h"],
        include_dirs=[NATIVE, ABI, UNWIND, ALLOCATORS, INTERPRETERS, PYTHON, PLATFORM],
        libraries=["gcc_s", "dl", "pthread"],
        # Whole-library optimisation: the unsampled call's path crosses files (forward.c, blocks.c).
        extra_compile_args=FLAGS + ["-flto"],
        # Its calls to its own entry points stay its own when an attach dlopens it (not first in scope).
        extra_link_args=["-Wl,-Bsymbolic-functions", "-flto", "-O2"],
    ),
    # The same interpreter for unwind/tables.py (through ctypes): a module's .eh_frame compiled to rows.
    Extension(
        "leaktrace.unwind._cfi",
        sources=[f"{UNWIND}/cfi.c"],
        depends=CFI,
        include_dirs=[UNWIND, ABI, PLATFORM],
        define_macros=[("CFI_EXPORT", '__attribute__((visibility("default")))')],
        extra_compile_args=FLAGS,
    ),
])
