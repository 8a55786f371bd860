"""The in-process engine: leaktrace's LD_PRELOAD library (src/leaktrace/sources/preload/native/*.c), held
to the BPF engine on the same programs, and its option parser held to the Python one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from each import each

from leaktrace.android.options import OptionError, check_engine_options, options_header, parse_malloc_debug_options
from leaktrace.sources.preload.trace import PreloadTrace, preload_library

from conftest import leaktrace_command
from helpers import TIMEOUT, final_report, library_env, reports, run_command, run_with_library, sites

REPO = Path(__file__).parents[2]


def both_engines(*args: str) -> tuple[dict, dict]:
    """The final JSON report of the same command under each engine."""
    bpf = final_report(run_command([*args, "--json", "3600"]))
    preload = final_report(run_command([*args, "--json", "3600", "--engine", "preload"]))
    return bpf, preload


def without_libc_internals(report: dict) -> dict:
    """Per call site, leaving out what the C runtime (libc, ld.so) allocates for itself."""

    def runtime(group: dict) -> bool:
        module = os.path.basename(group["frames"][0]["module"] or "") if group["frames"] else ""
        return module.startswith(("libc.so", "ld-linux"))

    return sites({**report, "groups": [g for g in report["groups"] if not runtime(g)]})


@pytest.mark.parametrize(
    "args",
    [
        ("shapes",),
        ("threads", "4"),
        ("sizes", "24", "100", "192", "320", "1000", "4096"),
    ],
)
def test_same_leak_groups_as_the_bpf_engine(program, args):
    command = " ".join([str(program(args[0])), *args[1:]])
    bpf, preload = both_engines("-c", command)
    assert without_libc_internals(preload) == without_libc_internals(bpf)
    # The rest differ for a reason: the library brings a TLS module of its own, so each
    # thread's DTV (allocated by ld.so) is 16 bytes longer under the preload engine.
    assert preload["live_allocations"] == bpf["live_allocations"]
    # The library counts the calls the probes count, read from the file it writes at exit.
    assert [preload["counters"][name] for name in ("allocations", "frees", "unknown_frees", "missed_frees")] == [
        bpf["counters"][name] for name in ("allocations", "frees", "unknown_frees", "missed_frees")
    ]


def test_size_filters_match(program):
    command = f"{program('sizes')} 24 100 192 256 320 1000"
    bpf, preload = both_engines("-c", command, "--options", "backtrace_min_size=192 backtrace_max_size=320")
    assert sites(preload) == sites(bpf)
    assert sites(bpf)["alloc_size"] == [(192, 1), (256, 1), (320, 1)]
    assert sorted(sites(bpf)["(filtered)"]) == [(24, 1), (100, 1), (1000, 1)]


def test_options_header_is_generated_from_the_python_table():
    assert (REPO / "src/leaktrace/sources/preload/native/options.h").read_text() == options_header()


@pytest.mark.parametrize(
    "text",
    [
        "backtrace=300",
        "backtrace=abc",
        "backtrace=-1",
        "bt=5x",
        "unknown_option",
        "leak_track=1",
        "backtrace_size",
        "backtrace=99999999999999999999",
        "bt_min_sz=0",
        "guard",
        "free_track=10",
        "backtrace leak_track",
        "bt=32 bt_sz=64",
        "backtrace_min_size=100 backtrace_max_size=200",
        # Hostile strings: a number past any integer type, separators C's isspace() does not know.
        "backtrace=" + "9" * 5000,
        "backtrace\x1cleak_track",
        "backtrace\u00a0leak_track",
        "backtrace\u2003leak_track",
        "leak_track\x01",
        "backtrace\tleak_track\v",
        # Long names and values are judged whole (a C parser with fixed buffers would cut them).
        "backtrace=" + "0" * 5000 + "8",
        "x" * 300,
        "backtrace=" + "0" * 300 + "300",
        "backtrace_dump_prefix=/tmp/" + "b" * 300,
        "backtrace_dump_prefix=/tmp/" + "c" * 5000,
    ],
)
def test_both_parsers_accept_and_refuse_the_same_strings(text):
    """The C side (run in a real process) prints exactly what the Python side raises."""
    try:
        check_engine_options(parse_malloc_debug_options(text), "preload")
        expected = ""
    except OptionError as e:
        expected = str(e).removeprefix("leaktrace: ")
    result = run_with_library(["/bin/true"], text)
    # "\n" only: splitlines() would also split at \x1c, which is part of an option's name here.
    lines = [line.split(": ", 1)[1] for line in result.stderr.split("\n") if line]
    if expected:
        assert lines == [expected, "malloc debug disabled: bad LIBC_DEBUG_MALLOC_OPTIONS"]
    else:
        assert lines == []
    assert result.returncode == 0  # the program runs on, on plain glibc when the options are bad


def test_preload_lib_path_leak_track_and_in_process_helper(tmp_path):
    path = subprocess.run(leaktrace_command("--preload-lib"), capture_output=True, text=True, timeout=TIMEOUT)
    assert path.returncode == 0 and path.stdout.strip() == preload_library()
    script = (
        "import ctypes\n"
        "from leaktrace.sources.preload.trace import leak_info_in_process\n"
        "libc = ctypes.CDLL(None)\n"
        "libc.malloc.restype = ctypes.c_void_p\n"
        "kept = [libc.malloc(77777) for _ in range(3)]\n"
        "entries = [e for e in leak_info_in_process() if e.size == 77777]\n"
        "print(len(entries), entries[0].num_allocations if entries else 0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={
            "LD_PRELOAD": path.stdout.strip(),
            "LIBC_DEBUG_MALLOC_OPTIONS": "backtrace=8 leak_track",
            "PYTHONPATH": str(REPO),
        },
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "3"]
    leaks = [line for line in result.stderr.splitlines() if line.startswith("+++ python")]
    assert any(" leaked block of size 77777 at 0x" in line for line in leaks)


def test_fork_child_marks_its_own_blocks_with_the_zygote_bit(program, tmp_path):
    """tests/integration/programs/fork_exit.c under the library: each process's exit dump (v1.2)."""
    prefix = tmp_path / "heap"
    result = run_with_library(
        [str(program("fork_exit"))], f"backtrace backtrace_dump_on_exit backtrace_dump_prefix={prefix}"
    )
    assert result.returncode == 0, result.stderr
    family = []
    for path in tmp_path.glob("heap.*.exit.txt"):
        records = [line.split("  bt")[0] for line in path.read_text().splitlines() if line.startswith("z ")]
        family.append(sorted(" ".join(record.split()) for record in records))
    assert sorted(family) == [
        ["z 0 sz 100 num 1"] * 2,  # the parent (two call sites)
        ["z 0 sz 100 num 1", "z 1 sz 200 num 1"],
    ]  # the child: inherited z 0, own z 1


def test_attach_to_a_process_started_with_the_library(program, tmp_path):
    """-p PID --engine preload: a program started with the library elsewhere is asked for dumps
    (written at its next allocator call, where its own options say)."""
    prefix = tmp_path / "dump"
    worker = subprocess.Popen(
        [str(program("workers")), "churn"],
        stdout=subprocess.PIPE,
        text=True,
        env=library_env(f"backtrace=8 backtrace_dump_prefix={prefix}"),
    )
    try:
        assert worker.stdout.readline().startswith("ready")
        tool = subprocess.Popen(
            leaktrace_command("-p", str(worker.pid), "--engine", "preload", "--json", "0.3"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert "through" in tool.stderr.readline()
        first = json.loads(tool.stdout.readline())
        worker.kill()
        worker.wait()
        out, err = tool.communicate(timeout=TIMEOUT)
    finally:
        worker.kill()
    assert tool.returncode == 0, err
    assert [p["pid"] for p in first["processes"]] == [worker.pid]
    assert first["counters"]["allocations"] > first["counters"]["frees"] > 0  # read in place beside the dump
    assert any(g["frames"] and g["frames"][0]["function"] == "_IO_file_doallocate" for g in first["groups"])
    assert json.loads(out.splitlines()[-1])["processes"][0]["exited"]
    assert f"pid {worker.pid} exited" in err


def test_an_idle_program_is_read_in_place_without_a_signal(program):
    """No allocator call for 2 s: every report still comes (the table is read while the
    program is stopped), and its sleep runs to the end (no signal cuts it short)."""
    started = time.monotonic()
    result = run_command(["-c", f"{program('idle')} 2", "--engine", "preload", "--json", "0.3"])
    elapsed = time.monotonic() - started
    found = reports(result.stdout)
    assert result.returncode == 0, result.stderr
    assert len(found) >= 5 and all(sites(report)["keep_some"] == [(4321, 5)] for report in found)
    assert elapsed >= 2.0
    for report in found:  # the library's counters, read in place with its table
        counters = report["counters"]
        assert counters["allocations"] - counters["frees"] == report["live_allocations"] > 0


def test_snapshots_of_a_program_that_never_stops_allocating(program):
    """A thread that allocates and frees without pause often holds the table's lock when
    the process is stopped: each read lets it go and tries again until the lock is free."""
    with PreloadTrace.launch([str(program("workers")), "churn"], "backtrace=8") as trace:
        try:
            time.sleep(0.3)
            snapshots = [trace.snapshot() for _ in range(30)]
        finally:
            os.kill(trace.pid, signal.SIGKILL)
            trace.wait()
    # The one block that stays: stdout's buffer, from the "ready" line.
    assert all(sum(g.count for g in s.groups if g.size == 4096) == 1 for s in each(snapshots))


def test_attach_to_an_idle_process(program):
    """-p PID: the process is asked for a dump; it makes no allocator call to write one,
    so after DUMP_WAIT its table is read in place."""
    idle = subprocess.Popen([str(program("idle")), "60"], env=library_env("backtrace"))
    try:
        time.sleep(0.2)
        result = run_command(["-p", str(idle.pid), "--engine", "preload", "--json", "0.2", "2"])
        assert idle.poll() is None  # still waiting: the signal cut a sleep short, not the wait
    finally:
        idle.kill()
        idle.wait()
    assert result.returncode == 0, result.stderr
    found = reports(result.stdout)
    assert len(found) == 2 and all(sites(report)["keep_some"] == [(4321, 5)] for report in found)


def workdirs_of(pid: int) -> list[Path]:
    return sorted(Path("/tmp").glob(f"leaktrace-preload-{pid}-*"))


def test_a_command_that_outlives_its_trace_goes_on_silent(program):
    """leaktrace stops after one report (COUNT) while its command runs on: the command ends
    later with no word about leaktrace's dump directory, which is gone, and leaves no file."""
    tracer = subprocess.Popen(
        leaktrace_command("-c", f"{program('idle')} 2", "--engine", "preload", "--json", "0.3", "1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = tracer.communicate(timeout=TIMEOUT)  # its pipes close when the command ends too
    assert tracer.returncode == 0 and len(reports(out)) == 1
    assert "heap dump" not in err and "leaktrace-preload" not in err, err
    assert workdirs_of(tracer.pid) == []


def test_the_dump_directory_of_a_killed_leaktrace_is_removed_at_the_next_start(program, tmp_path):
    tracer = subprocess.Popen(
        leaktrace_command("-c", f"{program('idle')} 60", "--engine", "preload", "3600"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = tracer.stderr.readline()
    command = int(line.split("' ")[1].split()[0])
    [left] = workdirs_of(tracer.pid)
    tracer.kill()
    tracer.wait()
    assert left.is_dir()
    planted = Path("/tmp") / f"leaktrace-preload-{tracer.pid + 1000000}-link"
    planted.symlink_to(tmp_path)
    try:
        assert run_command(["-c", "true", "--engine", "preload"]).returncode == 0
        assert not left.exists()
        assert planted.is_symlink() and tmp_path.is_dir()  # not a directory of leaktrace's: left alone
    finally:
        planted.unlink()
        os.kill(command, signal.SIGKILL)
