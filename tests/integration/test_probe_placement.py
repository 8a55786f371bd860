"""Probe placement: the kernel's emulation rule, and where the probes go in Debian's libraries."""

from __future__ import annotations

import pytest

from leaktrace.platform.elf import ElfFile
from leaktrace.sources.bpf.engine import place_probes
from leaktrace.sources.bpf.probe_placement import kernel_emulates

from helpers import run_command

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
MIMALLOC = "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2.0"
MUSL = "/usr/lib/x86_64-linux-musl/libc.so"
# The one function of these four left unprobed: glibc's reallocarray multiplies into rdx (its
# third argument) before its first jump, so its own probe would be single-stepped; it only
# checks the product and tail-calls realloc, whose probe counts its calls.
UNPROBED = {(LIBC, "reallocarray")}


@pytest.mark.parametrize(
    "code, emulated",
    [
        ("53", True),  # push rbx
        ("4154", True),  # push r12
        ("90", True),  # nop
        ("7403", True),  # je rel8
        ("0f84c2000000", True),  # je rel32
        ("e8aabbccdd", True),  # call rel32
        ("e9aabbccdd", True),  # jmp rel32
        ("f2e9aabbccdd", True),  # bnd jmp rel32
        ("66e8aabb", False),  # callw: 0x66 prefix
        ("4885ff", False),  # test rdi, rdi
        ("660f1f440000", False),  # nopw: single-stepped
        ("4889f8", False),  # mov rax, rdi
        ("c3", False),  # ret
    ],
)
def test_kernel_emulation_rule(code, emulated):
    assert kernel_emulates(bytes.fromhex(code)) is emulated


def placements(library: str) -> dict[str, object]:
    elf = ElfFile(library)
    return place_probes(elf, elf.dynamic_functions)


def test_glibc_free_probe_moves_past_its_test_onto_the_jump():
    elf = ElfFile(LIBC)
    found = placements(LIBC)
    free = found["free"]
    assert elf.read(free.entry, 3) == bytes.fromhex("4885ff")  # test rdi, rdi
    assert free.moved == 3 and free.instruction[0] == 0x0F and kernel_emulates(free.instruction)
    assert found["malloc"].moved == 0 and "emulated" in found["malloc"].why
    # mul rewrites rdx, one of reallocarray's arguments: its probe could not move; it tail-calls
    # realloc, so it is left to realloc's probe, and says why.
    assert found["reallocarray"].unprobed and "tail-calls realloc" in found["reallocarray"].why


@pytest.mark.parametrize("library", [LIBC, JEMALLOC, TCMALLOC, MIMALLOC])
def test_no_probe_on_debians_allocators_is_single_stepped(library):
    """The probed bytes, read back from the file and decoded by the kernel's rule: emulated
    for every function of the four allocators (glibc's reallocarray is left to realloc's probe)."""
    elf = ElfFile(library)
    for function, placement in placements(library).items():
        assert elf.read(placement.address, len(placement.instruction)) == placement.instruction
        assert placement.unprobed == ((library, function) in UNPROBED), placement.why
        if not placement.unprobed:
            assert kernel_emulates(placement.instruction) and "emulated" in placement.why, placement.why


def test_arguments_are_read_where_the_function_moved_them():
    """jemalloc's free keeps its pointer in rdi past nine loads and moves; mimalloc's malloc,
    calloc and realloc move theirs before their first jump, and the probe reads them there."""
    free = placements(JEMALLOC)["free"]
    assert free.moved == 0x30 and free.registers == ("rdi",)
    mimalloc = placements(MIMALLOC)
    assert mimalloc["malloc"].registers == ("rsi",) and mimalloc["malloc"].moved == 0x15
    assert mimalloc["calloc"].registers == ("rax", "rsi")
    assert mimalloc["realloc"].registers == ("rsi", "rdx")
    assert "rdi in rsi, rsi in rdx there" in mimalloc["realloc"].why


def test_verbose_says_where_each_probe_went(program):
    result = run_command(["-c", str(program("shapes")), "-v", "3600"])
    assert result.returncode == 0, result.stderr
    assert "leaktrace: free: probe at +0x3 on je" in result.stderr
    assert "leaktrace: malloc: probe at entry (push r12 is emulated)" in result.stderr


@pytest.mark.parametrize(
    "library, name",
    [(LIBC, "glibc"), (JEMALLOC, "jemalloc"), (TCMALLOC, "tcmalloc"), (MIMALLOC, "mimalloc"), (MUSL, "musl")],
)
def test_each_debian_allocator_is_recognised_by_its_family(library, name):
    """The allocators package names the family of each library (musl's: Debian's musl-tools),
    and what it says of it (its
    usable-size function, its free-like extras) is what the library exports."""
    from leaktrace.allocators import ALLOCATING, FREE, family_of

    exported = ElfFile(library).dynamic_functions
    family = family_of(exported)
    assert family is not None and family.name == name
    assert family.usable_size in exported and all(extra in exported for extra in family.free_like)
    assert FREE.name in exported and {"malloc", "calloc", "realloc"} <= {f.name for f in ALLOCATING} & set(exported)
