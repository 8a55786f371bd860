"""The Android outputs of real traces: leak-info buffer, heap dumps, the exit leak log."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

from each import each
from test_exact_counts import SHAPES, SHAPES_BYTES, SHAPES_COUNT

from leaktrace.android.leak_info import decode_leak_info
from leaktrace.platform.process import parse_maps

from helpers import AttachedTrace, final_report, run_command, wait_for_line


def test_leak_info_buffer_matches_report(program, tmp_path):
    buffer_file = tmp_path / "leak.bin"
    result = run_command(["-c", str(program("shapes")), "--json", "--leak-info", str(buffer_file), "3600"])
    report = final_report(result)
    assert re.search(
        rf"overall_size {11 * 144}, info_size 144, total_memory {SHAPES_BYTES}, backtrace_size 16", result.stderr
    )
    entries = decode_leak_info(buffer_file.read_bytes(), 16)
    assert sorted((e.size, e.num_allocations) for e in entries) == sorted(
        pair for pairs in SHAPES.values() for pair in pairs
    )
    assert [e.size for e in entries] == sorted((e.size for e in entries), reverse=True)
    by_size = {g["size"]: [f["address"] - 1 for f in g["frames"]] for g in report["groups"]}
    for entry in entries:
        assert list(entry.frames) == by_size[entry.size]
        assert not entry.zygote


def resolvable(pc: int, maps: list) -> bool:
    return any(m.start <= pc < m.end and "x" in m.perms and m.path.startswith("/") for m in maps)


def test_heap_dump_on_exit(program, tmp_path):
    prefix = tmp_path / "heap"
    result = run_command(
        ["-c", str(program("shapes")), "--options", f"backtrace_dump_on_exit backtrace_dump_prefix={prefix}", "3600"]
    )
    assert result.returncode == 0, result.stderr
    (dump,) = tmp_path.glob("heap.*.exit.txt")
    assert f"heap dump written to {dump}" in result.stderr
    text = dump.read_text()
    head, maps_text = text.split("\nMAPS\n")
    lines = head.splitlines()
    assert lines[:3] == [
        "Android Native Heap Dump v1.2",
        "",
        f"Build fingerprint: 'Linux/{os.uname().release}/{os.uname().machine}'",
    ]
    assert lines[4:8] == [f"Total memory: {SHAPES_BYTES}", "Allocation records: 11", "Backtrace size: 16", ""]
    assert maps_text.endswith("END\n") and str(program("shapes")) in maps_text
    maps = parse_maps(maps_text.removesuffix("END\n"))
    records = lines[8:]
    assert len(records) == 11 and sum(int(r.split()[5]) for r in records) == SHAPES_COUNT
    for record in records:
        assert re.fullmatch(r"z 0  sz +\d+  num    \d+  bt( [0-9a-f]+)+", record), record
        pcs = [int(pc, 16) for pc in record.split(" bt ")[1].split()]
        assert all(resolvable(pc, maps) for pc in each(pcs))


def test_heap_dump_on_sigusr2_and_each_report(program, tmp_path):
    target = subprocess.Popen([str(program("shapes")), "wait"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert wait_for_line(target.stdout) == b"ready\n"
        trace = AttachedTrace(target.pid, "--heap-dump", str(tmp_path / "live"), "3600")
        target.stdin.write(b"x")
        target.stdin.flush()
        assert wait_for_line(target.stdout) == b"done\n"
        dump = tmp_path / f"live.{target.pid}.txt"
        trace.process.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while not dump.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert f"Total memory: {SHAPES_BYTES}\n" in dump.read_text()
        status, _, err = trace.stop()
        assert status == 0 and "Traceback" not in err
    finally:
        target.stdin.close()
        target.wait(timeout=30)


def test_leak_track_log(program):
    result = run_command(["-c", str(program("shapes")), "--options", "leak_track backtrace_min_size=100", "3600"])
    assert result.returncode == 0
    leaks = [line for line in result.stderr.splitlines() if line.startswith("+++ ")]
    assert len(leaks) == SHAPES_COUNT
    sizes = [int(re.search(r"of size (\d+) at 0x[0-9a-f]+ \(leak (\d+) of (\d+)\)", line).group(1)) for line in leaks]
    assert sizes == sorted(sizes, reverse=True)
    assert all(f"(leak {i} of {SHAPES_COUNT})" in line for i, line in each(enumerate(leaks, 1)))
    assert all(line.startswith("+++ shapes leaked block of size ") for line in each(leaks))
    lines = result.stderr.splitlines()
    first_100 = lines.index(next(line for line in leaks if "of size 100 at" in line))
    assert lines[first_100 + 1] == "Backtrace at time of allocation:"
    assert re.fullmatch(r"          #00  pc [0-9a-f]{16}  \S+/shapes \(leak_malloc\+\d+\)", lines[first_100 + 2])
    # Sizes under backtrace_min_size are logged without a backtrace.
    first_40 = lines.index(next(line for line in leaks if "of size 40 at" in line))
    assert first_40 + 1 == len(lines) or lines[first_40 + 1] != "Backtrace at time of allocation:"


def test_outputs_never_follow_symlinks(program, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    link = tmp_path / "leak.bin"
    link.symlink_to(victim)
    result = run_command(["-c", str(program("sites")), "--leak-info", str(link), "3600"])
    assert result.returncode == 2  # refused before the trace starts
    assert f"leaktrace: refusing --leak-info {link}: it is a symbolic link, not a regular file" in result.stderr
    assert victim.read_text() == "keep me" and link.is_symlink()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_decode_leak_info_command(program, tmp_path):
    buffer_file = tmp_path / "leak.bin"
    run_command(["-c", str(program("sites")), "--leak-info", str(buffer_file), "--frames", "4", "3600"])
    result = run_command(["decode-leak-info", str(buffer_file), "--backtrace-size", "4"])
    assert result.returncode == 0
    assert result.stdout.startswith("4 entries, total_memory 800\n")
    bad = run_command(["decode-leak-info", str(buffer_file), "--backtrace-size", "5"])
    assert bad.returncode == 1 and "is not a whole number of 56-byte entries" in bad.stderr
    empty = tmp_path / "empty.bin"  # the buffer of a process without live allocations
    empty.write_bytes(b"")
    result = run_command(["decode-leak-info", str(empty), "--backtrace-size", "4"])
    assert (result.returncode, result.stdout, result.stderr) == (0, "0 entries, total_memory 0\n", "")
