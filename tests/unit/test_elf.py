"""The ELF reader against Debian's own libraries."""

from __future__ import annotations

import pytest

from leaktrace.platform.elf import ElfFile


@pytest.mark.parametrize(
    "path, not_exported",
    [
        # (a variable it exports, a function it imports)
        ("/lib/x86_64-linux-gnu/libc.so.6", ("stdout", "__tls_get_addr")),
        ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", ("pthread_create",)),
        ("/usr/lib/x86_64-linux-gnu/libstdc++.so.6", ("_ZSt4cout", "malloc")),
    ],
)
def test_hash_lookup_agrees_with_the_symbol_table(path, not_exported):
    """One GNU-hash probe answers as a read of every symbol does."""
    elf = ElfFile(path)
    exported = elf.dynamic_functions
    assert all(elf.exports_function(name) for name in exported)
    for name in (*not_exported, "no_such_function"):
        assert name not in exported and not elf.exports_function(name)
