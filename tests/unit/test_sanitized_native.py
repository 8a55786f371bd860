"""The C that parses untrusted input, built with the sanitizers and -Werror: cfi.c under
AddressSanitizer and UndefinedBehaviorSanitizer on Debian's .eh_frame sections and damaged
copies of them (a driver of its own, tests/unit/native/cfi_damage.c), and the preload library
under UndefinedBehaviorSanitizer in a program allocating from several threads (AddressSanitizer
replaces malloc itself, so it cannot sit under a library that does too). No root needed."""

from __future__ import annotations

import random
import re
import subprocess
from pathlib import Path

import pytest
from preload_library import build_library

from leaktrace.platform.elf import ElfFile

ROOT = Path(__file__).parents[2]
UNWIND = ROOT / "src/leaktrace/unwind"
PLATFORM = ROOT / "src/leaktrace/platform"
WARNINGS = ["-Wall", "-Wextra", "-Werror"]
SANITIZE = ["-O1", "-g", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"]


@pytest.fixture(scope="module")
def cfi_damage(tmp_path_factory) -> Path:
    built = tmp_path_factory.mktemp("sanitized") / "cfi_damage"
    subprocess.run(
        [
            "gcc",
            *SANITIZE,
            "-fsanitize=address,undefined",
            *WARNINGS,
            f"-I{UNWIND}",
            f"-I{ROOT}/src/leaktrace/platform",
            f"-I{ROOT}/src/leaktrace/abi",
            "-o",
            built,
        ]
        + [ROOT / "tests/unit/native/cfi_damage.c", UNWIND / "cfi.c"],
        check=True,
    )
    return built


@pytest.mark.parametrize(
    "path, copies",
    [("/lib64/ld-linux-x86-64.so.2", 3000), ("/lib/x86_64-linux-gnu/libc.so.6", 300), ("/usr/bin/python3.11", 100)],
)
def test_cfi_c_reads_nothing_outside_a_damaged_section(cfi_damage, tmp_path, path, copies):
    section, address = ElfFile(path).section_bytes(".eh_frame")
    (tmp_path / "eh_frame").write_bytes(section)
    seed = random.randrange(1 << 32)
    print(f"seed {seed}")
    result = subprocess.run(
        [cfi_damage, tmp_path / "eh_frame", hex(address), str(seed), str(copies)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"seed {seed}: {result.stderr[-3000:]}"
    assert result.stdout.startswith("rows "), result.stdout


@pytest.fixture(scope="module")
def ubsan_library(tmp_path_factory) -> Path:
    built = tmp_path_factory.mktemp("sanitized") / "malloc_debug_ubsan.so"
    return build_library("gcc", built, [*SANITIZE, "-fsanitize=undefined", *WARNINGS, "-fvisibility=hidden"])


@pytest.mark.parametrize(
    "options",
    [
        "backtrace leak_track",
        "guard fill free_track verify_pointers backtrace=32 leak_track",
        "backtrace=64 backtrace_dump_on_exit backtrace_dump_prefix={dir}/dump",
    ],
)
def test_the_preload_library_has_no_undefined_behaviour(ubsan_library, tmp_path, options):
    program = tmp_path / "threads"
    source = ROOT / "tests/integration/programs/threads.c"
    subprocess.run(["gcc", "-O0", "-g", "-pthread", "-o", program, source], check=True)
    environment = {"LD_PRELOAD": str(ubsan_library), "LIBC_DEBUG_MALLOC_OPTIONS": options.format(dir=tmp_path)}
    result = subprocess.run([program, "8"], capture_output=True, text=True, env=environment, timeout=120)
    assert result.returncode == 0 and "runtime error" not in result.stderr, result.stderr[-3000:]
    if "leak_track" in options:
        assert "leaked block of size 48" in result.stderr
    else:
        [dump] = tmp_path.glob("dump.*.exit.txt")
        assert re.search(r"^z 0  sz       48  num    56  bt ", dump.read_text(), re.M)  # 8 threads x 7
