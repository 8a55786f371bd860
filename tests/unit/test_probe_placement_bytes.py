"""Probe placement on the recorded entry code of the four allocators' malloc and free (Debian
12's glibc 2.36, jemalloc, tcmalloc-minimal and mimalloc, golden/allocator_entries.json, read off
those libraries), assembled here into a library of its own: each probe lands on the first
instruction the kernel emulates that no branch inside the function reaches past, and says where
the argument is there (mimalloc's malloc moves it to rsi). Then a function whose entry is
reached by a branch, or that writes memory first, keeps its probe at the entry."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from each import each

from leaktrace.platform.elf import ElfFile
from leaktrace.sources.bpf.probe_placement import place_probe

RECORDED = json.loads((Path(__file__).parent / "golden" / "allocator_entries.json").read_text())


def assembled(tmp_path: Path, functions: dict[str, bytes]) -> ElfFile:
    """A shared library holding each function's bytes under its name, sized."""
    source = tmp_path / "entries.S"
    lines = [".text"]
    for name, code in functions.items():
        lines += [f".globl {name}", f".type {name}, @function", ".p2align 4", f"{name}:"]
        lines += [".byte " + ", ".join(str(b) for b in code[i : i + 16]) for i in range(0, len(code), 16)]
        lines += [f".size {name}, . - {name}"]
    source.write_text("\n".join(lines) + "\n")
    library = tmp_path / "libentries.so"
    subprocess.run(["gcc", "-shared", "-nostdlib", "-o", str(library), str(source)], check=True)
    return ElfFile(str(library))


@pytest.fixture(scope="module")
def recorded_library(tmp_path_factory) -> ElfFile:
    functions = {f"{entry['allocator']}_{entry['function']}": bytes.fromhex(entry["code"]) for entry in RECORDED}
    return assembled(tmp_path_factory.mktemp("entries"), functions)


@pytest.mark.parametrize("entry", RECORDED, ids=lambda e: f"{e['allocator']}-{e['function']}")
def test_each_allocator_s_probe_lands_where_recorded(recorded_library, entry):
    name = f"{entry['allocator']}_{entry['function']}"
    start = recorded_library.dynamic_functions[name]
    placement = place_probe(recorded_library, name, start, ("rdi",))
    assert (placement.moved, list(placement.registers)) == (entry["moved"], entry["registers"]), placement.why
    assert not placement.single_stepped


def test_the_recorded_cases_cover_each_kind_of_move():
    moves = {(e["allocator"], e["function"]): (e["moved"], e["registers"]) for e in RECORDED}
    assert moves["glibc", "malloc"] == (0, [])  # push r12: emulated where it is
    assert moves["glibc", "free"] == (3, ["rdi"])  # over test rdi, rdi to the je
    assert moves["mimalloc", "malloc"][1] == ["rsi"]  # mov rsi, rdi on the way
    assert moves["jemalloc", "free"][0] > 32  # nine loads and moves


def test_a_branch_back_to_the_entry_or_a_store_keeps_the_probe_at_the_entry(tmp_path):
    library = assembled(
        tmp_path,
        {
            # test rdi, rdi; test rdi, rdi; je +0; jmp back to the second test: the je is reached past the entry
            "looped": bytes.fromhex("4885ff4885ff7400ebf9c3"),
            # mov [rip+0], rdi (a store); je +0; ret
            "stores": bytes.fromhex("48893d000000007400c3"),
        },
    )
    for name, why in (("looped", "a branch lands on"), ("stores", "cannot be skipped")):
        placement = place_probe(library, name, library.dynamic_functions[name], ("rdi",))
        assert placement.moved == 0 and why in placement.why, placement.why


# Each aarch64 entry instruction, and whether the kernel simulates its uprobe (decode-insn.c):
# the first four are Debian 12's arm64 glibc 2.36 (malloc, reallocarray, free, and calloc's
# kind of prologue), read off /usr/aarch64-linux-gnu/lib/libc.so.6.
ARM64_ENTRIES = {
    "stp x29, x30, [sp, #-64]!": False,
    "umulh x3, x1, x2": False,
    "cbz x0, 1f": True,
    "sub sp, sp, #32": False,
    "paciasp": False,
    "nop": False,
    "adrp x1, 1f": True,
    "adr x1, 1f": True,
    "b 1f": True,
    "bl 1f": True,
    "b.ne 1f": True,
    "tbnz w0, #3, 1f": True,
    "ret": True,
    "br x16": True,
    "blr x16": True,
    "ldr x0, 1f": True,
    "ldrsw x0, 1f": True,
    "ldr x0, [x1]": False,
    "mov x29, sp": False,
}


def test_an_aarch64_probe_stays_at_its_entry_and_says_if_the_kernel_steps_it(tmp_path):
    """Cross-built with gcc-aarch64-linux-gnu: probes are never moved there, and each probe's cost
    is told by its instruction, as arm64's kernel decodes it."""
    source = tmp_path / "entries.S"
    lines = [".text"]
    for index, instruction in enumerate(ARM64_ENTRIES):
        lines += [f".globl f{index}", f".type f{index}, %function", ".p2align 3", f"f{index}:", instruction]
        lines += ["1:", ".word 0", f".size f{index}, . - f{index}"]
    source.write_text("\n".join(lines) + "\n")
    library = tmp_path / "libentries.so"
    built = ["aarch64-linux-gnu-gcc", "-march=armv8.3-a", "-shared", "-nostdlib", "-o", str(library), str(source)]
    subprocess.run(built, check=True)
    elf = ElfFile(str(library))
    for index, (instruction, simulated) in enumerate(each(ARM64_ENTRIES.items())):
        start = elf.dynamic_functions[f"f{index}"]
        placement = place_probe(elf, f"f{index}", start, ("regs[0]",))
        assert (placement.moved, placement.registers) == (0, ()), instruction
        assert placement.single_stepped is not simulated, (instruction, placement.why)
