"""The in-process attach under seccomp filters (every container runtime's default has one):
leaktrace reads the target's filters and runs them on each system call the attach and its
library will make; it attaches when all are allowed, and otherwise refuses in one line that
names the call and the action, with nothing called in the target (filtered.c)."""

from __future__ import annotations

import subprocess

import pytest

from leaktrace.platform.arch import HOST
from leaktrace.sources.preload.inject import ATTACH_CALLS

from helpers import TIMEOUT, library_hooked, preload_tracing, sites, trace_ended, wait_for_line

pytestmark = pytest.mark.usefixtures("cpu_hogs")

# What filtered.c itself calls once its filter is in: read, write, lseek, brk, rt_sigreturn,
# restart_syscall, exit_group, newfstatat.
PROGRAMS_OWN = {
    "x86_64": {0, 1, 8, 12, 15, 219, 231, 262},
    "aarch64": {63, 64, 62, 214, 139, 128, 94, 79},
}[HOST.machine]


def filtered(program, *words: str) -> subprocess.Popen:
    """filtered.c told words, a system call's name among them as this machine numbers it."""
    words = tuple(str(HOST.syscalls[word]) if word in HOST.syscalls else word for word in words)
    target = subprocess.Popen([program("filtered"), *words], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert wait_for_line(target.stdout) == "ready\n"
    return target


def allocates(target: subprocess.Popen) -> None:
    target.stdin.write("alloc\n")
    target.stdin.flush()
    assert wait_for_line(target.stdout) == "done\n"


@pytest.mark.parametrize(
    "words, named",
    [
        (["errno:1", "memfd_create"], "memfd_create: ERRNO(1)"),
        (["kill", "mmap", "0x4000"], "mmap: KILL_PROCESS"),
        (["notif", "mmap", "0x4000"], "mmap: USER_NOTIF"),
        (["trap", "memfd_create"], "memfd_create: TRAP(0)"),
        (["trace", "memfd_create"], "memfd_create: TRACE(0)"),
        (["log", "pipe2"], "pipe2: LOG"),
        (["errno:1", "clone3"], "clone3: ERRNO(1)"),
    ],
)
def test_a_filter_that_forbids_a_call_of_the_attach_is_refused_and_named(program, words, named):
    """mmap with MAP_NORESERVE (the calls' stack), memfd_create, pipe2, clone3: the target lives
    on untouched (no library mapped) and still allocates."""
    target = filtered(program, *words)
    try:
        tracer = preload_tracing(target.pid)
        _, err = tracer.communicate(timeout=TIMEOUT)
        assert tracer.returncode == 1 and "Traceback" not in err, err
        [line] = err.strip().splitlines()
        assert f"seccomp filter does not allow what the attach needs ({named})" in line, line
        assert target.poll() is None and not library_hooked(target.pid)
        allocates(target)
    finally:
        target.kill()
        target.wait()


def _attach_numbers() -> set[int]:
    return {call.number for call in ATTACH_CALLS} | {call.fallback.number for call in ATTACH_CALLS if call.fallback}


@pytest.mark.parametrize("clone3", ["allowed", "ENOSYS"])
def test_a_filter_allowing_only_the_planned_calls_kills_nothing_and_counts_exactly(program, clone3):
    """Every other call kills the process: an attach (or its library) that made a call it did
    not plan would kill it. Both thread starts: clone3, and clone where clone3 is ENOSYS."""
    allowed = _attach_numbers() | PROGRAMS_OWN
    words = ["only", ",".join(str(n) for n in sorted(allowed))]
    if clone3 == "ENOSYS":
        words = ["errno:38", "clone3"]
    target = filtered(program, *words)
    try:
        tracer = preload_tracing(target.pid)
        assert "attached in-process" in wait_for_line(tracer.stderr)
        allocates(target)
        report = trace_ended(tracer)
        assert sites(report).get("main") == [(2222, 5)], sites(report)
        assert target.poll() is None
        allocates(target)  # the hooks are out, the program goes on
    finally:
        target.kill()
        target.wait()
