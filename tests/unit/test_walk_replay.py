"""The BPF program's stack walk, replayed in user space without root: unwind/walk.bpf.h built
with its maps as arrays (tests/unit/native/walk_replay.c), fed a stack recorded from a real
program built -O2 without frame pointers (tests/unit/native/record_stack.c: through libc's
qsort, and through a signal handler) and the tables leaktrace compiles for its modules. Its
frames must equal libgcc's _Unwind_Backtrace of the same stack, and a damaged stack must end
the walk with its counter, never a wrong frame."""

from __future__ import annotations

import ctypes as ct
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from leaktrace.abi.layout import C_TRUNCATED_UNREADABLE_STACK
from leaktrace.platform.elf import ElfFile
from leaktrace.platform.process import parse_maps
from leaktrace.unwind.rows import EXEC_MAP, MAX_EXEC_MAPS, UNWIND_ROW
from leaktrace.unwind.tables import UnwindTables, exec_map_entry

ROOT = Path(__file__).parents[2]
NATIVE = ROOT / "tests/unit/native"
DEPTH = 64


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, ct.CDLL]:
    out = tmp_path_factory.mktemp("replay")
    recorder, replay = out / "record_stack", out / "walk_replay.so"
    subprocess.run(
        ["gcc", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-o", recorder, NATIVE / "record_stack.c"], check=True
    )
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas"]
        + [
            f"-DSTACK_DEPTH={DEPTH}",
            f"-I{ROOT}/src/leaktrace/abi",
            f"-I{ROOT}/src/leaktrace/unwind",
            f"-I{ROOT}/src/leaktrace/platform",
        ]
        + ["-o", replay, NATIVE / "walk_replay.c"],
        check=True,
    )
    library = ct.CDLL(str(replay))
    library.walk_replay.restype = ct.c_uint32
    library.walk_replay.argtypes = [ct.c_char_p, ct.c_char_p, ct.c_uint32, ct.c_char_p, ct.c_uint32, ct.c_char_p]
    library.walk_replay.argtypes += [ct.c_uint64] * 5 + [ct.POINTER(ct.c_uint64), ct.POINTER(ct.c_uint32)]
    return recorder, library


@dataclass
class Recording:
    pc: int
    sp: int
    bp: int
    truth: list[int]  # libgcc's return addresses, from the one the walk starts at
    stack: bytes  # from sp to the end of its mapping
    maps: str


def record(recorder: Path, how: str, path: Path) -> Recording:
    subprocess.run([recorder, how, path], check=True, timeout=30)
    data = path.read_bytes()
    pc, sp, bp, count = struct.unpack_from("<4Q", data)
    truth = list(struct.unpack_from(f"<{count}Q", data, 32))
    at = 32 + 8 * count
    (size,) = struct.unpack_from("<Q", data, at)
    return Recording(pc, sp, bp, truth, data[at + 8 : at + 8 + size], data[at + 8 + size :].decode())


def walk_tables(maps_text: str) -> tuple[bytes, bytes, bytes]:
    """struct exec_maps, the rows and the pages of a process, as leaktrace uploads them."""
    tables, rows, pages, entries = UnwindTables(), b"", b"", []
    for mapping in parse_maps(maps_text):
        if "x" not in mapping.perms or not mapping.path.startswith("/"):
            continue
        elf = ElfFile(mapping.path)
        table = tables.table_of(elf)
        located = (len(rows) // UNWIND_ROW.size, table.row_count, len(pages) // 8, table.page_count)
        rows, pages = rows + table.rows, pages + table.pages
        entries.append(exec_map_entry(mapping, elf, table, located))
    assert 0 < len(entries) <= MAX_EXEC_MAPS
    padding = bytes(EXEC_MAP.size * (MAX_EXEC_MAPS - len(entries)))
    return struct.pack("<II", 1, len(entries)) + b"".join(entries) + padding, rows, pages


def replay(library: ct.CDLL, recording: Recording, stack: bytes) -> tuple[list[int], int]:
    maps, rows, pages = walk_tables(recording.maps)
    frames, why = (ct.c_uint64 * DEPTH)(), ct.c_uint32()
    depth = library.walk_replay(
        maps,
        rows,
        len(rows) // UNWIND_ROW.size,
        pages,
        len(pages) // 8,
        stack,
        recording.sp,
        len(stack),
        recording.pc,
        recording.sp,
        recording.bp,
        frames,
        ct.byref(why),
    )
    return list(frames[:depth]), why.value


@pytest.mark.parametrize("how", ["qsort", "signal"])
def test_the_walk_gives_libgccs_frames(built, tmp_path, how):
    recorder, library = built
    recording = record(recorder, how, tmp_path / "stack")
    frames, why = replay(library, recording, recording.stack)
    assert why == 0
    assert frames == recording.truth
    assert len(frames) >= (9 if how == "qsort" else 8)  # record's callers up to _start, libc's among them


def test_a_stack_cut_short_ends_the_walk_with_its_counter(built, tmp_path):
    recorder, library = built
    recording = record(recorder, "qsort", tmp_path / "stack")
    frames, why = replay(library, recording, recording.stack[:256])
    assert why == C_TRUNCATED_UNREADABLE_STACK
    assert 1 <= len(frames) < len(recording.truth) and frames == recording.truth[: len(frames)]
