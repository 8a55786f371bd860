"""Allocator libraries other than glibc's: found from the program, or named with --lib."""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest

from conftest import DEBUG_BUILD, leaktrace_command
from helpers import final_report, free_port, reports, run_command, sites, wait_for_redis

JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
MIMALLOC = "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2.0"
LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
# What allocator_calls.c keeps from four threads: site -> [(size, count)].
ALLOCATOR_CALLS_LEAKS = {
    "leak_malloc": [(24, 28)],
    "leak_calloc": [(40, 20)],
    "leak_realloc": [(96, 16)],
    "leak_memalign": [(128, 12)],
    "leak_aligned": [(160, 8)],
}


def link_against(build_dir, program_source: str, library: str, name: str) -> str:
    out = build_dir / name
    subprocess.run(
        [
            *DEBUG_BUILD,
            "-o",
            str(out),
            program_source,
            library,
            f"-Wl,-rpath,{build_dir}",
        ],
        check=True,
    )
    return str(out)


def test_jemalloc_found_from_program(build_dir):
    binary = link_against(build_dir, "tests/integration/programs/sites.c", JEMALLOC, "sites_jemalloc")
    result = run_command(["-c", binary, "--json", "3600"])
    report = final_report(result)
    assert "/libjemalloc.so.2 (jemalloc): " in result.stderr
    # libstdc++ (which jemalloc loads) also keeps its 72704-byte exception pool.
    ours = {name: value for name, value in sites(report).items() if name.startswith("site_")}
    assert ours == {"site_a": [(16, 10)], "site_b": [(16, 10)], "site_c": [(16, 10)], "site_d": [(16, 20)]}


def test_jemalloc_threads(build_dir):
    binary = link_against(build_dir, "tests/integration/programs/threads.c", JEMALLOC, "threads_jemalloc")
    report = final_report(run_command(["-c", f"{binary} 4", "--json", "3600"]))
    assert sites(report)["thread_leak"] == [(48, 28)]


def test_lib_option_and_threads_inside_malloc_at_once(build_dir):
    library = build_dir / "libbarrier_alloc.so"
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O1",
            "-pthread",
            "-o",
            str(library),
            "tests/integration/programs/barrier_alloc.c",
        ],
        check=True,
    )
    binary = link_against(build_dir, "tests/integration/programs/two_callers.c", str(library), "two_callers")
    # Both threads are inside malloc at once: each thread's record of its call is its own.
    report = final_report(run_command(["-c", binary, "--lib", str(library), "--json", "3600"]))
    assert report["counters"]["pending_lost"] == 0
    assert report["counters"]["nested_calls"] == 0
    assert sites(report)["meet_in_malloc"] == [(77, 2)]


@pytest.mark.parametrize("library", [LIBC, JEMALLOC, TCMALLOC, MIMALLOC])
def test_every_call_of_each_debian_allocator_is_counted_exactly(program, library):
    """malloc, calloc, realloc, posix_memalign and aligned_alloc from four threads, with
    churn freed, through each allocator: the live blocks per site are what the program kept,
    and no probe traps on a single-stepped instruction."""
    preload = "" if library == LIBC else f"LD_PRELOAD={library} "
    result = run_command(
        ["-c", f"env {preload}{program('allocator_calls')} 4 exit", "--lib", library, "--json", "3600"]
    )
    report = final_report(result)
    assert "single-stepped" not in result.stderr, result.stderr
    ours = {name: value for name, value in sites(report).items() if name.startswith("leak_")}
    assert ours == ALLOCATOR_CALLS_LEAKS
    assert report["counters"]["unknown_frees"] == 0 and report["counters"]["missed_frees"] == 0


@pytest.mark.parametrize("library", [JEMALLOC, TCMALLOC, MIMALLOC])
def test_the_preload_library_forwards_to_the_programs_own_allocator(build_dir, library):
    """A program linked with jemalloc, tcmalloc or mimalloc under --engine preload: every block
    comes from (and goes back to) that allocator, never glibc's, and the counts are exact."""
    name = "allocator_calls_" + os.path.basename(library).split(".")[0]
    binary = link_against(build_dir, "tests/integration/programs/allocator_calls.c", library, name)
    result = run_command(["-c", f"{binary} 4 exit", "--engine", "preload", "--json", "3600"])
    report = final_report(result)
    ours = {name: value for name, value in sites(report).items() if name.startswith("leak_")}
    assert ours == ALLOCATOR_CALLS_LEAKS


def test_redis_with_jemalloc_runs_under_the_preload_library():
    """Debian's redis-server links jemalloc: under --engine preload it once died of SIGSEGV at
    start (jemalloc's malloc_usable_size given a glibc block). It serves, shuts down cleanly,
    and the reports show its blocks."""
    port = free_port()
    # Files, not pipes: reports and redis's log come while the test talks to redis, and a
    # full pipe would stop both.
    out_file, err_file = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    command = f"redis-server --port {port} --bind 127.0.0.1 --save '' --logfile ''"
    trace = subprocess.Popen(
        leaktrace_command("-c", command, "--engine", "preload") + ["--json", "0.5"],
        stdout=out_file,
        stderr=err_file,
        text=True,
    )
    try:
        wait_for_redis(port, lambda: trace.poll() is None)
        for i in range(200):
            assert (
                subprocess.run(
                    ["redis-cli", "-p", str(port), "set", f"key{i}", "x" * 100], capture_output=True
                ).returncode
                == 0
            )
        info = subprocess.run(
            ["redis-cli", "-p", str(port), "info", "memory"], capture_output=True, text=True, timeout=30
        ).stdout
        assert "mem_allocator:jemalloc" in info
        subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True, timeout=30)
        trace.wait(timeout=30)
        out_file.seek(0)
        err_file.seek(0)
        out, err = out_file.read(), err_file.read()
    finally:
        if trace.poll() is None:
            trace.kill()
            trace.wait()
    assert trace.returncode == 0, err
    assert err.splitlines()[-1].endswith("exited with status 0") and "Traceback" not in err
    assert reports(out)[-1]["live_allocations"] > 200
