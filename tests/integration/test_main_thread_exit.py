"""A process lives while any of its threads does: one whose first thread called pthread_exit
while the others go on allocating is traced, frozen and walked through a live thread, by
both engines and by `heap`."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from helpers import final_report, run_command, sites


@pytest.fixture
def main_exited(program):
    """busy_heap with its first thread gone: 5,000 blocks kept, two threads churning until it
    is killed (a trace slow to start under load must still find it alive)."""
    process = subprocess.Popen([str(program("busy_heap")), "5000", "2", "0", "main-exits"], stdout=subprocess.PIPE)
    assert process.stdout.readline() == b"ready\n"
    deadline = time.monotonic() + 5
    while "Z" not in Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]:
        assert time.monotonic() < deadline, "the first thread did not exit"
        time.sleep(0.01)
    yield process.pid
    process.kill()
    process.wait()


def test_attached_bpf_trace_sees_the_other_threads_calls(main_exited):
    result = run_command(["-p", str(main_exited), "--json", "1", "1"])
    report = final_report(result)
    assert f"pid {main_exited}'s first thread has exited" in result.stderr
    assert report["counters"]["allocations"] > 1000 and not report["processes"][0]["exited"], report["counters"]


def test_reachability_check_freezes_it_through_a_live_thread(main_exited):
    result = run_command(["-p", str(main_exited), "--unreachable", "--json", "1", "1"])
    assert "skipped" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert "unreachable" in final_report(result)


def test_heap_walk_reads_it_through_a_live_thread(main_exited):
    result = run_command(["heap", "-p", str(main_exited), "--json"])
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["blocks"] >= 5000, summary["problems"]


def test_preload_reports_while_it_runs(program):
    result = run_command(
        ["-c", f"{program('busy_heap')} 5000 2 2500 main-exits", "--engine", "preload", "--json", "0.5"]
    )
    report = final_report(result)
    assert "skipped" not in result.stderr, result.stderr
    assert sites(report)["kept_block"] == [(size, 5000 // 64 + (size - 16 < 5000 % 64)) for size in range(16, 80)]
    assert result.stderr.splitlines()[-1].endswith("exited with status 0")
