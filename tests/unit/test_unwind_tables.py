"""Unwind tables compiled from Debian's own libraries: the rules readelf's CFI gives, and the
page index the BPF walk narrows each row search with (searched here as the kernel does)."""

from __future__ import annotations

import bisect
import glob
import os
import random
import struct
import subprocess

import pytest

from leaktrace.platform.elf import ElfFile
from leaktrace.unwind.rows import RBP_SAVED
from leaktrace.unwind.tables import (
    CFA_END,
    CFA_RSP,
    CFA_SIGNAL,
    MAX_FILE_PAGES,
    PAGE,
    ROW_PAGE_SHIFT,
    UNWIND_ROW,
    Rule,
    compile_eh_frame,
    compile_rows,
    file_table,
    parse_frames_interp,
    readelf_frames,
    section_rows,
)

LIBRARIES = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/python3.11", "/lib64/ld-linux-x86-64.so.2"]


def table(path: str):
    return file_table(compile_rows(parse_frames_interp(readelf_frames(ElfFile(path)))))


def symbol(path: str, name: str) -> int:
    listing = subprocess.run(
        ["readelf", "--wide", "--dyn-syms", path], capture_output=True, text=True, check=True
    ).stdout
    return next(
        int(line.split()[1], 16)
        for line in listing.splitlines()
        if line.split() and line.split()[-1].split("@")[0] == name
    )


@pytest.mark.parametrize("path", LIBRARIES)
def test_the_page_index_narrows_every_search_to_the_right_row(path):
    """For any address, the last row at or below it (a search of every row) is found among
    its page's rows, as unwind_frames searches them (an address past the last page: the last)."""
    found = table(path)
    pcs = [pc for pc, *_ in UNWIND_ROW.iter_unpack(found.rows)]
    pages = list(PAGE.iter_unpack(found.pages))
    assert pcs == sorted(pcs) and found.page_count == ((pcs[-1] - found.page_origin) >> found.page_shift) + 1
    addresses = random.Random(7).sample(range(pcs[0], pcs[-1] + 4096), 20000) + pcs
    for vaddr in addresses:
        page = min((vaddr - found.page_origin) >> found.page_shift, found.page_count - 1)
        low, high = pages[page]
        assert 0 <= low < high <= len(pcs)
        within = bisect.bisect_right(pcs, vaddr, low, high) - 1
        assert within == bisect.bisect_right(pcs, vaddr) - 1, hex(vaddr)


@pytest.mark.parametrize("code_mib", [1, 300])
def test_a_module_of_any_size_gets_a_page_index_of_bounded_size(code_mib):
    """Rows spread over 300 MiB of code (more than chromium's 225) are indexed in larger pages,
    never more than MAX_FILE_PAGES of them, and every search still lands on the right row."""
    seed = 30
    print(f"seed {seed}")
    chooser = random.Random(seed)
    pcs = sorted(chooser.sample(range(0x1000, 0x1000 + (code_mib << 20)), 5000))
    found = file_table([(pc, Rule(CFA_RSP, 8 + 8 * (i % 7))) for i, pc in enumerate(pcs)])
    assert found.page_count <= MAX_FILE_PAGES
    assert (found.page_shift == ROW_PAGE_SHIFT) == (code_mib << 20 >> ROW_PAGE_SHIFT < MAX_FILE_PAGES)
    pages = list(PAGE.iter_unpack(found.pages))
    for vaddr in chooser.sample(range(pcs[0], pcs[-1] + 4096), 20000) + pcs:
        low, high = pages[min((vaddr - found.page_origin) >> found.page_shift, found.page_count - 1)]
        assert bisect.bisect_right(pcs, vaddr, low, high) - 1 == bisect.bisect_right(pcs, vaddr) - 1, hex(vaddr)


def test_rules_of_known_functions():
    libc = "/lib/x86_64-linux-gnu/libc.so.6"
    found = table(libc)
    rows = list(UNWIND_ROW.iter_unpack(found.rows))
    pcs = [row[0] for row in rows]

    def rule_at(vaddr: int) -> tuple:
        return rows[bisect.bisect_right(pcs, vaddr) - 1]

    entry = symbol(libc, "malloc")
    assert rule_at(entry)[1:4:2] == (8, CFA_RSP)  # at entry: CFA = rsp + 8, the return address at CFA-8
    # glibc's __restore_rt (the signal trampoline) is marked a signal frame; clone3's end has ra undefined.
    assert any(row[3] == CFA_SIGNAL for row in rows) and any(row[3] == CFA_END for row in rows)
    assert struct.calcsize("<IihBB") == UNWIND_ROW.size == 12


def modules_with_cfi() -> list[str]:
    """Debian's own: the libraries above, every shared library of the C and C++ runtimes, and
    some programs, C and C++ (readelf and cfi.c must agree on each)."""
    found = LIBRARIES + sorted(glob.glob("/lib/x86_64-linux-gnu/lib*.so.*"))[:60]
    found += [
        path for path in ("/usr/bin/gdb", "/usr/bin/ls", "/usr/bin/readelf", "/usr/bin/g++") if os.path.exists(path)
    ]
    return [os.path.realpath(path) for path in found if os.path.exists(path)]


@pytest.mark.parametrize("path", sorted(set(modules_with_cfi())))
def test_cfi_c_compiles_the_rows_readelf_gives(path):
    """The interpreter the preload library walks with (cfi.c) is the one that compiles the BPF
    walk's tables: for every module, its rows equal those of readelf's interpreted CFI."""
    elf = ElfFile(path)
    ours = compile_eh_frame(elf)
    if ours is None:
        assert ".eh_frame" not in elf.section_names()
        return
    assert compile_rows(ours) == compile_rows(parse_frames_interp(readelf_frames(elf)))


def test_cfi_c_survives_damaged_sections():
    """A file is untrusted input: any byte of .eh_frame changed, or the section cut short, gives
    rows or none, never a read outside the section (the process would die)."""
    section, address = ElfFile("/lib64/ld-linux-x86-64.so.2").section_bytes(".eh_frame")
    whole = section_rows(section, address)
    assert whole and all(start <= pc < end for start, end, pc, *_ in whole)
    rng = random.Random(11)
    for _ in range(2000):
        damaged = bytearray(section)
        for _ in range(rng.randint(1, 8)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        cut = rng.randrange(len(damaged) + 1) if rng.random() < 0.3 else len(damaged)
        rows = section_rows(bytes(damaged[:cut]), address)
        # Whatever the bytes, each row's rules are ones the walk knows.
        assert not [row for row in rows if row[-2] > CFA_SIGNAL or row[-1] > RBP_SAVED]  # damaged bytes may give none
    for _ in range(300):  # cut short, undamaged: the rows of the FDEs before the cut, as they were
        rows = section_rows(section[: rng.randrange(len(section) + 1)], address)
        assert rows == whole[: len(rows)]


def test_a_walk_ends_in_the_functions_musl_starts_stacks_in(tmp_path):
    """A static musl program: its libc's start functions have no CFI; marked by the family's
    stack_starts, each is one CFA_END row from its first byte (a table of its own digest)."""
    from leaktrace.allocators import FAMILIES
    from leaktrace.unwind.tables import UnwindTables, cfi_digest

    source, program = tmp_path / "main.c", tmp_path / "main"
    source.write_text("#include <stdlib.h>\nint main(void) { return malloc(1) == 0; }\n")
    subprocess.run(["musl-gcc", "-static", "-o", str(program), str(source)], check=True)
    elf = ElfFile(str(program))
    [musl] = [family for family in FAMILIES if family.name == "musl"]
    ends = elf.extents_of(musl.stack_starts)
    assert len(ends) == 1  # libc_start_main_stage2: this program starts no thread
    tables = UnwindTables()
    tables.end_walks_in(elf, ends)
    rows = list(UNWIND_ROW.iter_unpack(tables.table_of(elf).rows))
    start, end = ends[0]
    assert any(row[0] == start and row[3] == CFA_END for row in rows)
    assert cfi_digest(elf, tuple(ends)) != cfi_digest(elf)
