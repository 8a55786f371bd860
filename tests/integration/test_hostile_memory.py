"""A target's memory is hostile input. The library's table is read out of it: a program that
damages the table (its symbols are exported) gets one line per report saying so, never a
traceback, an unbounded allocation or a hang; leaktrace ends as usual. The reachability
check copies its writable memory: a target that reserves more than the machine can spare
gets one line, not an out-of-memory kill of root's tool."""

from __future__ import annotations

import subprocess
import time

import pytest

from helpers import AttachedTrace, reports, run_command, wait_for_line

DAMAGED = {
    "huge_slots": "slots at",
    "max_slots": "slots at",
    "null_table": "slots at 0x0 are not in its memory",
    "kernel_table": "slots at 0xffff888000000000",
    "wild_frames": "frames at 0xdead0000000",
    "huge_frame_count": "with 2147483648 frames",
    "huge_size": "a record of 4611686018427387904 bytes",
}


@pytest.mark.parametrize("mode", [*DAMAGED, "locked"])
def test_a_damaged_table_is_one_line_per_report(program, mode):
    started = time.monotonic()
    result = run_command(
        ["-c", f"{program('damaged_table', '-ldl')} {mode} 2", "--engine", "preload", "--json", "0.4"], timeout=60
    )
    assert time.monotonic() - started < 40
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "MemoryError" not in result.stderr
    expected = DAMAGED.get(mode, "kept its table locked through 100 tries")
    skipped = [line for line in result.stderr.splitlines() if line.startswith("leaktrace: report skipped:")]
    assert skipped and all(expected in line for line in skipped[:-1]), result.stderr
    # Nothing was ever read: the final report says so instead of "0 live bytes".
    assert "exited and left no table or dump that could be read" in skipped[-1]
    assert reports(result.stdout) == []


def test_a_damaged_table_skips_the_reachability_check(program):
    result = run_command(
        ["-c", f"{program('damaged_table', '-ldl')} wild_frames 2", "--engine", "preload", "--unreachable", "0.4", "1"],
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "the library's table in pid" in result.stderr and "is damaged" in result.stderr


def test_a_fake_table_of_a_million_records_is_read_within_bounds(program):
    """A well-formed table is what the library could have written: it is read, within bounds."""
    result = run_command(
        ["-c", f"{program('damaged_table', '-ldl')} fake_million 2", "--engine", "preload", "--json", "1", "1"],
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    [report] = reports(result.stdout)
    assert report["live_allocations"] == 1 << 20 and report["live_bytes"] == 8 << 20


def test_writable_memory_beyond_what_the_machine_can_spare_is_not_copied(program):
    target = subprocess.Popen([str(program("reserved")), "1024"], stdout=subprocess.PIPE, text=True)
    try:
        assert wait_for_line(target.stdout) == "ready\n"
        started = time.monotonic()
        trace = AttachedTrace(target.pid, "--unreachable", "0.3")
        time.sleep(1)
        status, out, err = trace.stop()
    finally:
        target.kill()
        target.wait()
    assert status == 0 and time.monotonic() - started < 30
    assert "Traceback" not in err and "MemoryError" not in err
    assert f"reachability check skipped: pid {target.pid} has 1024.0 GiB of writable memory to copy" in err
    assert reports(out)
