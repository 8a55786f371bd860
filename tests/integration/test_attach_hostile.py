"""The in-process attach where the target's view of the machine or its own design could be
turned against it: a mount namespace or a chroot in which another user owns leaktrace's
library path, a SIGSEGV handler that is part of the program, a thread waiting on a 4 KiB
coroutine stack, a PID namespace of its own, a stopped target. Under CPU hogs, with the
targets allocating from several threads."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from leaktrace.sources.preload.table import preload_library

from conftest import PROGRAMS, leaktrace_command
from helpers import TIMEOUT, library_hooked, preload_attached, preload_tracing, trace_ended, wait_for_line

pytestmark = pytest.mark.usefixtures("cpu_hogs")

NOBODY = pwd.getpwnam("nobody")
PLANTED_STATUS = 77  # planted_library.c's constructor ends the process with it


def in_own_mount_namespace(script: str, *arguments: str) -> list[str]:
    """sh -c script arguments... in a mount namespace of its own, private."""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, *arguments]


@pytest.fixture
def planted_directory(tmp_path, build_dir):
    """A directory the unprivileged user nobody owns, holding a library of theirs under the
    name of leaktrace's."""
    planted = tmp_path / "planted"
    planted.mkdir()
    library = planted / os.path.basename(preload_library())
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", library, PROGRAMS / "planted_library.c"], check=True)
    for path in (planted, library):
        os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    os.chmod(tmp_path, 0o755)
    return planted


def started(argv: list[str], **options) -> subprocess.Popen:
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True, **options)
    assert wait_for_line(process.stdout) == "ready\n"
    return process


def innermost(pid: int) -> int:
    """The process that unshare (and chroot, and sh) end up exec'ing: the last child down."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if not children:
            return pid
        pid = int(children[0])
    raise AssertionError("no innermost process")


def stopped(process: subprocess.Popen) -> None:
    process.kill()
    process.wait()


def test_a_library_another_user_owns_at_leaktraces_path_in_the_targets_mount_namespace_never_runs(
    program, planted_directory
):
    """A root service in its own mount namespace, where a bind mount (as container runtimes and
    systemd's BindPaths= make) puts nobody's directory over leaktrace's library directory: the
    attach loads leaktrace's own bytes, and the planted constructor never runs."""
    library_directory = os.path.dirname(preload_library())
    launcher = started(
        in_own_mount_namespace(
            'mount --bind "$0" "$1" && exec "$2"',
            str(planted_directory),
            library_directory,
            str(program("attach_target")),
        )
    )
    try:
        target = innermost(launcher.pid)
        assert Path(f"/proc/{target}/root{library_directory}").stat().st_uid == NOBODY.pw_uid
        tracer = preload_attached(target)
        assert library_hooked(target)
        launcher.send_signal(signal.SIGUSR1)
        assert wait_for_line(launcher.stdout) == "done\n"
        report = trace_ended(tracer)
        assert sum(g["count"] for g in report["groups"] if g["size"] in (100, 101, 102, 103)) == 200
        assert launcher.poll() is None and not library_hooked(target)
    finally:
        stopped(launcher)
    assert launcher.returncode != PLANTED_STATUS


def test_a_chroot_without_procfs_is_refused_in_one_line_and_nothing_is_loaded(program, planted_directory, tmp_path):
    """A chrooted root service whose view of leaktrace's library path runs through a directory
    nobody owns: no procfs at its /proc, so leaktrace cannot name its copy of the library
    there and refuses; the planted library is never loaded."""
    root = tmp_path / "root"
    library_directory = os.path.dirname(preload_library())
    inside = root / library_directory.lstrip("/")
    inside.parent.mkdir(parents=True)
    shutil.copytree(planted_directory, inside)
    os.chown(inside, NOBODY.pw_uid, NOBODY.pw_gid)
    (root / "usr").mkdir()
    for name in ("lib", "lib64", "bin"):
        (root / name).symlink_to(f"usr/{name}")
    shutil.copy(program("attach_target"), root / "target")
    launcher = started(in_own_mount_namespace('mount --bind /usr "$0/usr" && exec chroot "$0" /target', str(root)))
    try:
        target = innermost(launcher.pid)
        tracer = preload_tracing(target)
        out, err = tracer.communicate(timeout=TIMEOUT)
        assert tracer.returncode == 1, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "is not a procfs" in lines[0] and "Traceback" not in err, err
        assert launcher.poll() is None and not library_hooked(target)
    finally:
        stopped(launcher)
    assert launcher.returncode != PLANTED_STATUS


@pytest.mark.parametrize("waits", ["sigwaitinfo", "coroutine"])
def test_a_target_with_its_own_sigsegv_handler_and_a_small_stack_runs_on_unharmed(program, waits):
    """guarded_target's main thread blocks every signal (so the thread a call runs in has
    SIGSEGV blocked) and a worker's guard page is opened by its SIGSEGV handler, at 500 faults
    a second; with `coroutine` main waits in read() on a 4 KiB stack over a guard page. Two
    attach and detach cycles, then the program must still handle its faults and end well."""
    target = started([str(program("guarded_target")), waits])
    try:
        for _ in range(2):
            tracer = preload_attached(target.pid)
            assert library_hooked(target.pid)
            report = trace_ended(tracer)
            assert report["counters"]["allocations"] > 0
            assert not library_hooked(target.pid)
        time.sleep(0.2)  # the worker faults a hundred times more
        if waits == "coroutine":
            target.stdin.write("x")
            target.stdin.flush()
        else:
            target.send_signal(signal.SIGUSR1)
        line = wait_for_line(target.stdout)
        assert line.startswith("faults ") and int(line.split()[1]) > 100, line
        assert target.wait(timeout=TIMEOUT) == 0
    finally:
        if target.poll() is None:
            stopped(target)


def test_a_target_in_its_own_pid_namespace_loses_its_hooks_when_leaktrace_is_killed(program):
    """The library cannot name leaktrace by a pid from inside another PID namespace: the pipe
    leaktrace holds hangs up when it is killed, the hooks come out, and a new attach works."""
    launcher = started(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", str(program("attach_target"))])
    try:
        target = innermost(launcher.pid)
        assert Path(f"/proc/{target}/ns/pid").resolve() != Path("/proc/self/ns/pid").resolve()
        tracer = preload_attached(target)
        assert library_hooked(target)
        tracer.kill()
        tracer.wait()
        deadline = time.monotonic() + 2
        while library_hooked(target):
            assert time.monotonic() < deadline, "the hooks stayed in after leaktrace was killed"
        again = preload_attached(target)
        assert library_hooked(target)
        assert trace_ended(again)["counters"]["allocations"] > 0
        assert not library_hooked(target) and launcher.poll() is None
    finally:
        stopped(launcher)


def test_a_stopped_target_is_refused_for_being_stopped(program):
    target = started([str(program("attach_target"))])
    try:
        os.kill(target.pid, signal.SIGSTOP)
        tracer = preload_tracing(target.pid)
        _, err = tracer.communicate(timeout=TIMEOUT)
        assert tracer.returncode == 1
        assert err.strip().splitlines() == [
            f"leaktrace: cannot attach in-process: pid {target.pid} is stopped "
            "(SIGSTOP or a debugger): continue it first"
        ], err
        os.kill(target.pid, signal.SIGCONT)
        assert not library_hooked(target.pid) and target.poll() is None
    finally:
        stopped(target)


@pytest.mark.parametrize("engine", ["bpf", "preload"])
def test_a_process_whose_main_thread_exited_is_traced_exactly(program, engine):
    """main_exited's first thread called pthread_exit: /proc/PID/environ, fd and map_files
    are gone with it, so leaktrace reads through a live thread (/proc/PID/task/TID); the BPF
    engine's probes cannot be filtered by the exited thread's pid, and say so."""
    target = started([str(program("main_exited"))])
    try:
        deadline = time.monotonic() + TIMEOUT
        while Path(f"/proc/{target.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        tracer = subprocess.Popen(
            leaktrace_command("-p", str(target.pid), "--engine", engine, "--json", "3600"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        said = wait_for_line(tracer.stderr)
        while not any(live in said for live in ("probes live", "attached in-process")):
            line = tracer.stderr.readline()  # select cannot see a line readline has buffered already
            assert line, said
            said += line
        assert ("first thread has exited" in said) == (engine == "bpf"), said
        target.stdin.write("xx")
        target.stdin.flush()
        assert wait_for_line(target.stdout) == "done\n"
        report = trace_ended(tracer)
        kept = {
            g["size"]: (g["count"], g["frames"][0]["function"]) for g in report["groups"] if g["size"] in (300, 301)
        }
        assert kept == {300: (50, "keep"), 301: (50, "keep")}, kept
    finally:
        stopped(target)
