"""The preload library's allocator-side options (guards, fills, expand_alloc, free_track,
verify_pointers, abort_on_error): real misuse in tests/integration/programs/heap_errors.c, and
bionic's error texts on stderr, byte for byte but for the addresses of frames."""

from __future__ import annotations

import re
import signal
import subprocess

import pytest

from helpers import final_report, run_command, run_with_library

DIVIDER = "*** *** *** *** *** *** *** *** *** *** *** *** *** *** *** ***"
FRAME = re.compile(r" {10}#(\d\d)  pc [0-9a-f]{16}  (\S+)(?: \((\S+)\+\d+\))?$")


def run(program, mode: str, options: str) -> tuple[subprocess.CompletedProcess, str]:
    """heap_errors MODE under the library; the result and the block's address it printed."""
    result = run_with_library([str(program("heap_errors", "-rdynamic")), mode], options)
    found = re.search(r"^block (0x[0-9a-f]+)$", result.stdout, re.M)
    return result, found.group(1) if found else ""


def report(stderr: str) -> list[str]:
    """The lines between the first two dividers, each frame reduced to '#NN function'."""
    lines = stderr.splitlines()
    start = lines.index(DIVIDER)
    body = lines[start + 1 : lines.index(DIVIDER, start + 1)]
    out = []
    for line in body:
        frame = FRAME.match(line)
        out.append(f"#{frame.group(1)} {frame.group(3)}" if frame else line)
    return out


def innermost(lines: list[str], heading: str) -> str:
    """The first frame after a heading line."""
    return lines[lines.index(heading) + 1]


def test_rear_guard_damage_is_reported_at_free(program):
    result, block = run(program, "rear", "guard")
    assert result.returncode == 0 and result.stdout.endswith("done\n")
    lines = report(result.stderr)
    assert lines[:4] == [
        f"+++ ALLOCATION {block} SIZE 100 HAS A CORRUPTED REAR GUARD",
        "  allocation[100] = 0x11 (expected 0xbb)",
        "  allocation[101] = 0x22 (expected 0xbb)",
        "Backtrace at time of failure:",
    ]
    assert lines[4:6] == ["#00 corrupt_rear", "#01 main"]


def test_front_guard_damage_is_reported_with_a_negative_index(program):
    result, block = run(program, "front", "front_guard=16")
    lines = report(result.stderr)
    assert lines[:3] == [
        f"+++ ALLOCATION {block} SIZE 40 HAS A CORRUPTED FRONT GUARD",
        "  allocation[-1] = 0x00 (expected 0xaa)",
        "Backtrace at time of failure:",
    ]
    assert innermost(lines, "Backtrace at time of failure:") == "#00 corrupt_front"


def test_free_track_finds_a_write_after_free_and_shows_the_free(program):
    result, block = run(program, "after_free", "free_track")
    assert result.returncode == 0
    lines = report(result.stderr)
    assert lines[:3] == [
        f"+++ ALLOCATION {block} USED AFTER FREE",
        "  allocation[10] = 0x01 (expected 0xef)",
        "Backtrace at time of free:",
    ]
    assert lines[3] == "#00 write_after_free"


@pytest.mark.parametrize(
    "mode, options, error, original_free",
    [
        ("double_free", "guard", "USED AFTER FREE (free)", False),
        ("double_free", "guard free_track", "USED AFTER FREE (free)", True),
        ("double_free", "verify_pointers", "UNKNOWN POINTER (free)", False),
        ("double_free", "free_track", "UNKNOWN POINTER (free)", True),
        # glibc wrote 32 bytes of large-bin links into the freed chunk: the tag is past them.
        ("double_free_large", "guard", "USED AFTER FREE (free)", False),
    ],
)
def test_double_free(program, mode, options, error, original_free):
    result, block = run(program, mode, options)
    assert result.returncode == 0, result.stderr  # the second free is refused, not passed to glibc
    lines = report(result.stderr)
    assert lines[0] == f"+++ ALLOCATION {block} {error}"
    assert ("Backtrace of original free:" in lines) == original_free
    assert innermost(lines, "Backtrace at time of failure:") in ("#00 free_twice", "#00 free_large_twice")


def test_a_pointer_not_from_malloc(program):
    result, block = run(program, "unknown", "verify_pointers")
    assert report(result.stderr)[0] == f"+++ ALLOCATION {block} UNKNOWN POINTER (free)"
    result, block = run(program, "unknown", "guard")  # the header is checked first, as upstream does
    assert re.fullmatch(rf"\+\+\+ ALLOCATION {block} HAS INVALID TAG [0-9a-f]+ \(free\)", report(result.stderr)[0])


def test_abort_on_error(program):
    result, _ = run(program, "rear", "rear_guard abort_on_error")
    assert result.returncode == -signal.SIGABRT
    assert "HAS A CORRUPTED REAR GUARD" in result.stderr and "done" not in result.stdout


def test_fills(program):
    result, _ = run(program, "fill", "fill free_track")  # held back, the freed block keeps its fill
    assert result.stdout.splitlines()[:2] == ["malloc 100 calloc 0 realloc_kept 0 realloc_grown 100", "freed 100"]
    result, _ = run(program, "fill", "fill_on_alloc=10")
    assert result.stdout.splitlines()[0] == "malloc 10 calloc 0 realloc_kept 0 realloc_grown 0"
    assert result.stderr == ""


@pytest.mark.parametrize(
    "options, least, most",
    [
        ("rear_guard", 100, 100),
        ("guard=64 expand_alloc=64", 100, 100),  # a rear guard makes it exact
        ("expand_alloc", 116, 200),
        ("expand_alloc=1000", 1100, 1200),
        ("backtrace", 100, 120),
    ],
)
def test_usable_size(program, options, least, most):
    result, _ = run(program, "usable", options)
    assert least <= int(result.stdout.split()[1]) <= most, result.stdout


def test_clean_programs_run_clean_under_every_check(program):
    """No false alarm: a program that misuses nothing, with every allocator-side option at once."""
    result, _ = run(program, "fill", "guard=32 fill expand_alloc free_track=10 verify_pointers backtrace leak_track")
    assert result.returncode == 0
    assert DIVIDER not in result.stderr


def test_leaktrace_passes_allocator_options_to_the_library(program):
    """-c CMD --engine preload --options 'guard ...': the command's stderr carries the
    library's report, and leaktrace still gives its own at exit; the BPF engine refuses."""
    command = f"{program('heap_errors', '-rdynamic')} rear"
    result = run_command(["-c", command, "--engine", "preload", "--options", "guard backtrace=4", "--json", "3600"])
    assert "HAS A CORRUPTED REAR GUARD" in result.stderr
    assert final_report(result)["processes"][0]["exited"]
    refused = run_command(["-c", command, "--options", "guard"])
    assert refused.returncode == 2
    assert refused.stderr == (
        "leaktrace: option 'guard' works only inside the allocator; the BPF engine sees calls, not memory\n"
    )
