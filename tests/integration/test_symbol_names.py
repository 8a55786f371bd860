"""A module chooses its DWARF names: one with newlines and blank lines must not desync the
reading of the symbolizer's answers (it fabricated inlined frames, and moved main to the
file and line the name spelled); llvm-symbolizer's JSON keeps each answer to its address."""

from __future__ import annotations

import subprocess

import pytest

from conftest import PROGRAMS
from helpers import final_report, run_command

pytestmark = pytest.mark.usefixtures("cpu_hogs")

HOSTILE = "x\\n\\nmain\\n/etc/passwd:1:1\\n\\n"  # as the assembler's .string spells it


def test_a_function_name_with_newlines_changes_no_other_frame(build_dir):
    source = PROGRAMS / "poisoned_name.c"
    assembly, renamed, binary = (build_dir / f"poisoned_name{suffix}" for suffix in (".s", "_renamed.s", ""))
    subprocess.run(["gcc", "-g", "-O1", "-fno-omit-frame-pointer", "-S", "-o", assembly, source], check=True)
    text = assembly.read_text()
    assert text.count('.string\t"poisoned"') == 1
    renamed.write_text(text.replace('.string\t"poisoned"', f'.string\t"{HOSTILE}"'))
    subprocess.run(["gcc", "-o", binary, renamed], check=True)
    report = final_report(run_command(["-c", str(binary), "--json", "3600"]))
    [group] = [g for g in report["groups"] if g["size"] == 4242]
    frames = [(f["function"], f.get("inlined", False), f.get("file"), f.get("line")) for f in group["frames"]]
    assert frames[:3] == [
        ("x\\x0a\\x0amain\\x0a/etc/passwd:1:1\\x0a\\x0a", True, str(source), 5),
        ("outer", False, str(source), 6),
        ("main", False, str(source), 7),
    ], frames
    assert sum(1 for frame in frames if frame[1]) == 1
