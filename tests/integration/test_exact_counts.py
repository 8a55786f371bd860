"""Exact live counts and bytes per call site, with real BPF, from -c and from -p."""

from __future__ import annotations

import signal
import subprocess

import pytest
from each import each

from helpers import AttachedTrace, final_report, run_command, sites, wait_for_line

# tests/integration/programs/shapes.c: innermost function -> [(size, live count)]
SHAPES = {
    "leak_malloc": [(100, 10)],
    "leak_calloc": [(128, 5)],
    "realloc_grow": [(5000, 3)],
    "realloc_null": [(70, 1)],
    "before_failed_realloc": [(40, 1)],
    "leak_posix_memalign": [(200, 3)],
    "leak_aligned_alloc": [(256, 2)],
    "leak_memalign": [(96, 1)],
    "leak_valloc": [(1000, 1)],
    "leak_pvalloc": [(8192, 1)],
    "leak_reallocarray": [(300, 1)],
}
SHAPES_BYTES = sum(size * count for groups in SHAPES.values() for size, count in groups)
SHAPES_COUNT = sum(count for groups in SHAPES.values() for _, count in groups)
ABSENT = ("chain_start", "realloc_to_zero", "churn", "failed_posix_memalign", "failed_realloc")


def assert_shapes(report: dict) -> None:
    table = sites(report)
    assert {name: table.get(name) for name in SHAPES} == SHAPES
    for name in ABSENT:
        assert name not in table
    assert report["live_bytes"] == SHAPES_BYTES
    assert report["live_allocations"] == SHAPES_COUNT
    losses = {
        k: v
        for k, v in report["counters"].items()
        if k not in ("allocations", "frees", "nested_calls", "unknown_frees")
    }
    assert set(losses.values()) == {0}, losses


def test_command_exact_per_call_site(program, probes_left_as_found):
    report = final_report(run_command(["-c", str(program("shapes")), "--json", "3600"]))
    assert_shapes(report)
    assert report["counters"]["unknown_frees"] == 0
    assert report["processes"][0]["exited"] is True


@pytest.mark.parametrize(
    "script",
    [
        '#!/bin/sh\nx=$(echo run)\nexec {program} "$@"\n',  # dash, which allocates before its exec
        "#!/usr/bin/env python3\nimport os, sys\nos.execv('{program}', sys.argv)\n",  # env, then python3
    ],
    ids=["sh", "env-python3"],
)
def test_a_script_command_is_traced_through_its_exec(program, tmp_path, script, probes_left_as_found):
    """A command that is a script runs as given; the program it execs is traced, exactly."""
    command = tmp_path / "run-shapes"
    command.write_text(script.format(program=program("shapes")))
    command.chmod(0o755)
    result = run_command(["-c", f"{command} an-argument", "--json", "3600"])
    report = final_report(result)
    assert_shapes(report)
    assert [process["comm"] for process in report["processes"]] == ["shapes"]


def test_a_script_that_execs_another_allocators_program_says_so(tmp_path):
    """redis-server allocates through jemalloc: a script that execs it is traced through libc,
    and the trace says in one line that the program's allocator was not traced."""
    command = tmp_path / "redis-version"
    command.write_text("#!/bin/sh\nexec redis-server --version\n")
    command.chmod(0o755)
    result = run_command(["-c", str(command), "--json", "3600"])
    final_report(result)
    lines = [line for line in result.stderr.splitlines() if "was not traced" in line]
    assert lines == [
        "leaktrace: the command's last program (redis-server) allocated through"
        " /usr/lib/x86_64-linux-gnu/libjemalloc.so.2, which was not traced: name it with --lib"
    ]


def test_frames_name_the_call_chain(program):
    report = final_report(run_command(["-c", str(program("shapes")), "--json", "3600"]))
    grown = [g for g in report["groups"] if g["frames"] and g["frames"][0]["function"] == "realloc_grow"]
    assert len(grown) == 1
    frames = grown[0]["frames"]
    assert [f["function"] for f in frames[:2]] == ["realloc_grow", "main"]
    assert frames[0]["module"] == str(program("shapes"))
    assert frames[0]["file"].endswith("shapes.c") and frames[0]["line"] == 20
    assert all(f["offset"] > 0 for f in each(frames[:2]))


def attached_shapes_report(program) -> dict:
    """The final report of -p on `shapes wait`, attached before it allocates and stopped (SIGINT)
    once it is done."""
    target = subprocess.Popen([str(program("shapes")), "wait"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert wait_for_line(target.stdout) == b"ready\n"
        trace = AttachedTrace(target.pid, "3600")
        target.stdin.write(b"x")
        target.stdin.flush()
        assert wait_for_line(target.stdout) == b"done\n"
        status, out, err = trace.stop(signal.SIGINT)
    finally:
        target.stdin.close()
        target.wait(timeout=30)
    return final_report(subprocess.CompletedProcess([], status, out, err))


def test_attach_exact_per_call_site(program, probes_left_as_found):
    report = attached_shapes_report(program)
    assert_shapes(report)
    # The 7 blocks of 33 bytes were made before the trace and freed during it.
    assert report["counters"]["unknown_frees"] == 7
    assert report["processes"][0]["exited"] is False


def test_attached_target_exit_ends_trace_with_final_report(program):
    target = subprocess.Popen([str(program("shapes")), "wait"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert wait_for_line(target.stdout) == b"ready\n"
    trace = AttachedTrace(target.pid, "3600")
    target.stdin.write(b"x")
    target.stdin.flush()
    assert wait_for_line(target.stdout) == b"done\n"
    target.stdin.close()
    target.wait(timeout=30)
    out, err = trace.process.communicate(timeout=60)
    assert trace.process.returncode == 0
    assert f"pid {target.pid} exited" in err
    report = final_report(subprocess.CompletedProcess([], 0, out, err))
    assert_shapes(report)
    assert report["processes"][0]["exited"] is True


@pytest.mark.parametrize("threads", [2, 8])
def test_threads_first_allocations_counted(program, threads):
    report = final_report(run_command(["-c", f"{program('threads')} {threads}", "--json", "3600"]))
    table = sites(report)
    assert table["thread_leak"] == [(48, 7 * threads)]
    # glibc frees each thread's cache at thread exit: the allocator's own frees, not unknown ones.
    assert report["counters"]["unknown_frees"] == 0
    assert report["counters"]["internal_frees"] > 0
    assert report["counters"]["pending_lost"] == 0
    assert report["counters"]["stale_calls"] == 0


def test_periodic_reports_then_count_ends_trace(program):
    target = subprocess.Popen([str(program("shapes")), "wait"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert wait_for_line(target.stdout) == b"ready\n"
        result = run_command(["-p", str(target.pid), "--json", "0.2", "3"])
    finally:
        target.stdin.close()
        target.wait(timeout=30)
    assert result.returncode == 0, result.stderr
    assert len([line for line in result.stdout.splitlines() if line.startswith("{")]) == 3


def test_older_than(program):
    old = final_report(run_command(["-c", str(program("shapes")), "--json", "--older-than", "600000", "3600"]))
    assert old["groups"] == [] and old["live_bytes"] == 0
    young = final_report(run_command(["-c", str(program("shapes")), "--json", "--older-than", "0", "3600"]))
    assert_shapes(young)


def test_text_report_lists_sites(program):
    result = run_command(["-c", str(program("shapes")), "--top", "3", "3600"])
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert f"{SHAPES_BYTES} live bytes in {SHAPES_COUNT} allocations" in text
    assert "top 3 of 11 stacks by live bytes:" in text
    assert "realloc_grow+0x" in text and "shapes.c:20" in text
    [drops] = [line for line in text.splitlines() if line.startswith("drops: ")]
    assert drops == "drops: none" or drops.startswith("drops: live_map_full 0, ")  # nested_calls may be counted
