"""The preload library built outside setup.py, from the same sources and headers, for tests that
need another build of it: under a sanitizer (tests/unit/test_sanitized_native.py) or for
another machine (tests/integration/test_arm64_library.py, with gcc-aarch64-linux-gnu)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[1]
SRC = ROOT / "src/leaktrace"
NATIVE = SRC / "sources/preload/native"
INCLUDES = [
    NATIVE,
    SRC / "abi",
    SRC / "unwind",
    SRC / "allocators",
    SRC / "interpreters",
    SRC / "interpreters/python",
    SRC / "platform",
]


LIBRARY_SOURCES = [*sorted(NATIVE.glob("*.c")), SRC / "unwind/cfi.c", SRC / "interpreters/python/python_stack.c"]


def build_library(compiler: str, built: Path, flags: list[str]) -> Path:
    """The library as setup.py links it (its own calls bound to itself), with the compiler's flags."""
    sources = LIBRARY_SOURCES
    subprocess.run(
        [compiler, "-shared", "-fPIC", *flags, *(f"-I{d}" for d in INCLUDES), "-o", str(built), *map(str, sources)]
        + ["-lgcc_s", "-ldl", "-lpthread", "-Wl,-Bsymbolic-functions", "-Wl,--eh-frame-hdr"],
        check=True,
    )
    return built
