"""C and Python share layouts written once: the BPF program's layout.h, the unwinder's rows.h
and the preload library's record.h are the sources of truth, and the Python modules made from them
(layout_gen.py) must be current; so must allocators.h, made from the allocators package. The
Counters fields follow the kernel's counter order."""

from __future__ import annotations

import dataclasses

import pytest

from leaktrace.abi import layout
from leaktrace.abi import record as preload_layout
from leaktrace.abi.layout_gen import ABI, LAYOUTS, generated, struct_body, struct_format
from leaktrace.allocators import c_header
from leaktrace.interpreters.python import versions
from leaktrace.model.snapshot import Counters
from leaktrace.platform import arch
from leaktrace.unwind import rows


@pytest.mark.parametrize("header", sorted(LAYOUTS), ids=lambda path: path.name)
def test_generated_layout_is_current(header):
    assert LAYOUTS[header].read_text() == generated(header), "stale: run python -m leaktrace.abi.layout_gen"


def test_python_versions_header_is_current():
    """The preload library reads the version table through python_versions.h."""
    assert versions.HEADER.read_text() == versions.generated(), (
        "stale: run python -m leaktrace.interpreters.python.versions"
    )


def test_python_offsets_follow_the_c_struct():
    header = ABI.parent / "interpreters" / "python" / "python_frames.h"
    _, names = struct_format(struct_body(header.read_text(), "python_offsets"))
    assert tuple(names) == versions.PythonOffsets._fields


def test_allocators_header_is_current():
    """The preload library reads the allocators package through allocators.h."""
    assert c_header.HEADER.read_text() == c_header.generated(), "stale: run python -m leaktrace.allocators.c_header"


def test_counters_follow_the_kernel_counter_order():
    assert tuple(field.name for field in dataclasses.fields(Counters)) == layout.COUNTER_FIELDS
    assert len(layout.COUNTER_FIELDS) == layout.C_COUNTERS


def test_struct_formats_have_the_c_sizes():
    # the sizes clang gives these structs on x86-64 (the engine reads the kernel's maps with them)
    assert (
        layout.LIVE_KEY.size,
        layout.LIVE_VAL.size,
        layout.SITE_KEY.size,
        layout.PROC.size,
        rows.UNWIND_ROW.size,
        rows.EXEC_MAP.size,
    ) == (16, 32, 24, 48, 12, 48)
    # native/table.c asserts the same of struct table_shard: two shards never share a cache line
    assert (preload_layout.RECORD.size, preload_layout.TABLE_SHARD.size) == (40, 128)
    # sites.c asserts the same: a line each
    assert (preload_layout.SITE.size, preload_layout.SITE_COUNTS.size, preload_layout.SITE_SHARD.size) == (64, 64, 64)


def test_architecture_header_is_current():
    """The library, the CFI interpreter and the BPF programs read the architecture tables through arch.h."""
    assert arch.HEADER.read_text() == arch.c_header(), "stale: run python -m leaktrace.platform.arch"
