"""The ELF reader against Debian's own libraries and one the test builds."""

from __future__ import annotations

import subprocess

import pytest
from each import each

from leaktrace.platform.elf import ElfFile

BUILT = "built by the test"
# 64 functions, so that the GNU hash table has buckets of several; a variable; an import.
BUILT_SOURCE = "#include <pthread.h>\nint exported_variable;\n" + "".join(
    f"int function_{i}(void) {{ return {i} + pthread_create(0, 0, 0, 0); }}\n" for i in range(64)
)


@pytest.fixture(scope="module")
def built_library(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("elf")
    (directory / "lib.c").write_text(BUILT_SOURCE)
    out = directory / "libbuilt.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O0", "-o", str(out), str(directory / "lib.c")], check=True)
    return str(out)


@pytest.mark.parametrize(
    "path, not_exported",
    [
        # (a variable it exports, a function it imports)
        ("/lib/x86_64-linux-gnu/libc.so.6", ("stdout", "__tls_get_addr")),
        (BUILT, ("exported_variable", "pthread_create")),
        ("/usr/lib/x86_64-linux-gnu/libstdc++.so.6", ("_ZSt4cout", "malloc")),
    ],
)
def test_hash_lookup_agrees_with_the_symbol_table(path, not_exported, built_library):
    """One GNU-hash probe answers as a read of every symbol does."""
    elf = ElfFile(built_library if path == BUILT else path)
    exported = elf.dynamic_functions
    assert all(elf.exports_function(name) for name in each(exported))
    if path == BUILT:
        assert {f"function_{i}" for i in range(64)} <= set(exported)
    for name in (*not_exported, "no_such_function"):
        assert name not in exported and not elf.exports_function(name)
