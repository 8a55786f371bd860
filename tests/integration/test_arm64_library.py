"""The preload library on aarch64, the arm64 parts that need no VM, run on an x86-64 machine:
the library built with gcc-aarch64-linux-gnu from the same sources (platform/arch.h picks
aarch64's table), aarch64 programs run under qemu-aarch64-static with Debian's arm64 libc. On
an arm64 machine (scripts/vm.sh --arch arm64) the same, built and run natively.
- Preloaded, it counts every call site exactly, each frame in its `bl` (pc - 4, as bionic).
- Attached by the program itself as leaktrace -p has a process attach it (dlopen, then
  leaktrace_attach), its GOT hooks take the program's calls through R_AARCH64_JUMP_SLOT.
- Its heap dump reads back into a snapshot (read_heap_dump), the dump's machine named in it."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from preload_library import build_library

from leaktrace.android.heap_dump import read_heap_dump
from leaktrace.platform.elf import ElfFile
from leaktrace.platform.process import parse_maps

PROGRAMS = Path(__file__).parent / "programs"
NATIVE = os.uname().machine == "aarch64"
QEMU = [] if NATIVE else ["qemu-aarch64-static", "-L", "/usr/aarch64-linux-gnu"]
TOOLS = "" if NATIVE else "aarch64-linux-gnu-"  # gcc and objdump for aarch64
SITES = {"site_a": 10, "site_b": 10, "site_c": 10, "site_d": 20}  # sites.c and self_attach.c's leaks
LEAK = re.compile(r"^\+\+\+ \S+ leaked block of size 16 at 0x[0-9a-f]+ \(leak \d+ of 50\)$")
FRAME = re.compile(r"^ +#00  pc ([0-9a-f]{16})  (\S+) \((\w+)\+(\d+)\)$")


@pytest.fixture(scope="module")
def arm64(tmp_path_factory) -> Path:
    """The library and the two programs, built for aarch64."""
    out = tmp_path_factory.mktemp("arm64")
    build_library(f"{TOOLS}gcc", out / "malloc_debug.so", ["-O2", "-Wall", "-Wextra", "-Werror"])
    for name in ("sites", "self_attach"):
        subprocess.run([f"{TOOLS}gcc", "-O2", "-g", "-o", out / name, PROGRAMS / f"{name}.c"], check=True)
    return out


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    if NATIVE:
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})
    settings = [word for name, value in (env or {}).items() for word in ("-E", f"{name}={value}")]
    return subprocess.run([*QEMU, *settings, *argv], capture_output=True, text=True, timeout=120)


def _innermost_calls(stderr: str, program: Path) -> Counter[str]:
    """The leak log's leaks by the function of their frame #00, each frame checked to be the
    address of a `bl` in the program (objdump's reading of it)."""
    lines = stderr.splitlines()
    starts = [i for i, line in enumerate(lines) if LEAK.match(line)]
    assert len(starts) == 50, stderr[-2000:]
    functions: Counter[str] = Counter()
    checked: set[int] = set()
    for i in starts:
        assert lines[i + 1] == "Backtrace at time of allocation:"
        frame = FRAME.match(lines[i + 2])
        assert frame, lines[i + 2]
        pc, module, function = int(frame.group(1), 16), frame.group(2), frame.group(3)
        assert module == str(program)
        if pc not in checked:
            dump = [f"{TOOLS}objdump", "-d", f"--start-address={pc:#x}", f"--stop-address={pc + 4:#x}"]
            text = subprocess.run([*dump, str(program)], capture_output=True, text=True, check=True).stdout
            assert re.search(rf"^ +{pc:x}:\t[0-9a-f]{{8}} \tbl\t", text, re.M), text
            checked.add(pc)
        functions[function] += 1
    return functions


def test_the_preloaded_library_counts_an_aarch64_program_exactly(arm64):
    run = _run(
        [str(arm64 / "sites")],
        {"LD_PRELOAD": str(arm64 / "malloc_debug.so"), "LIBC_DEBUG_MALLOC_OPTIONS": "backtrace leak_track"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert _innermost_calls(run.stderr, arm64 / "sites") == SITES


def test_an_attach_patches_an_aarch64_programs_got(arm64):
    """Without the JUMP_SLOT patch the program's mallocs bypass the library: no leak is logged."""
    run = _run([str(arm64 / "self_attach"), str(arm64 / "malloc_debug.so")])
    assert run.returncode == 0, run.stderr[-2000:]
    assert _innermost_calls(run.stderr, arm64 / "self_attach") == SITES


def test_an_aarch64_heap_dump_reads_back_exactly(arm64, tmp_path):
    options = f"backtrace backtrace_dump_on_exit backtrace_dump_prefix={tmp_path}/heap"
    run = _run(
        [str(arm64 / "sites")], {"LD_PRELOAD": str(arm64 / "malloc_debug.so"), "LIBC_DEBUG_MALLOC_OPTIONS": options}
    )
    assert run.returncode == 0, run.stderr[-2000:]
    (dump,) = tmp_path.glob("heap.*.exit.txt")
    text = dump.read_text()
    assert re.search(r"^Build fingerprint: 'Linux/[^/]+/aarch64'$", text, re.M)
    snapshot = read_heap_dump(text, 1, "sites", time.time(), exited=True)
    (process,) = snapshot.processes.values()
    program = ElfFile(str(arm64 / "sites"))
    found: Counter[str] = Counter()
    for group in snapshot.groups:
        (mapping,) = [
            m for m in parse_maps(process.maps) if m.path == str(arm64 / "sites") and m.start <= group.stack[0] < m.end
        ]
        vaddr = program.file_offset_to_vaddr(group.stack[0] - mapping.start + mapping.offset)
        # The return address is back where the call returns to: 4 bytes past the `bl`.
        assert vaddr is not None and program.read(vaddr - 4, 4)[3] >> 2 == 0b100101
        symbol = program.function_at(vaddr - 4)
        assert symbol is not None
        found[symbol.name] += group.count
    assert found == SITES
