"""A command leaktrace starts (-c), in either engine, starts as a shell would start it:
every signal at its default disposition and none blocked, whatever leaktrace's own Python
ignores (SIGPIPE, SIGXFSZ) or its caller blocked, with the limits it was given (leaktrace
lifts its own RLIMIT_MEMLOCK for BPF); and one that cannot run is one line."""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import struct
import subprocess
import time
from pathlib import Path

import pytest

from leaktrace.platform.arch import HOST
from leaktrace.platform.process import process_state

from conftest import leaktrace_command
from helpers import TIMEOUT, run_command

pytestmark = pytest.mark.usefixtures("cpu_hogs")

SCRIPT = (
    'yes | head -n1; echo ${PIPESTATUS[@]}; grep -E "^Sig(Ign|Blk)" /proc/self/status; '
    'grep "Max locked memory" /proc/self/limits'
)
MEMLOCK = 65536  # the limit before Linux 5.11 (leaktrace lifts its own for the BPF engine)


@pytest.mark.parametrize("engine", ["bpf", "preload"])
def test_a_launched_command_starts_with_default_signals_an_empty_mask_and_its_limits(engine):
    syscall = ctypes.CDLL(None).syscall
    ignore = ctypes.create_string_buffer(struct.pack("<Q", 1), 32)  # struct kernel_sigaction: SIG_IGN

    def block_and_ignore_some() -> None:
        """leaktrace's own parent blocks two signals and ignores three, glibc's two among them
        (which glibc's posix_spawn would leave ignored in its child)."""
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGTERM})
        for sig in (signal.SIGHUP, 32, 33):
            syscall(HOST.syscalls["rt_sigaction"], sig, ignore, None, 8)
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (MEMLOCK, MEMLOCK))

    result = subprocess.run(
        leaktrace_command("-c", f"bash -c '{SCRIPT}'", "--engine", engine, "3600"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        preexec_fn=block_and_ignore_some,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # yes dies of SIGPIPE (141), as under a shell, instead of saying "Broken pipe".
    assert "141 0" in lines and "Broken pipe" not in result.stderr, (lines, result.stderr)
    assert "SigIgn:\t0000000000000000" in lines and "SigBlk:\t0000000000000000" in lines, lines
    assert [line.split()[3:5] for line in lines if line.startswith("Max locked")] == [[str(MEMLOCK)] * 2], lines


def all_threads_stopped(pid: int) -> bool:
    """Every thread of pid stopped, or pid gone."""
    tids: list[str] = []
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        tids = os.listdir(f"/proc/{pid}/task")
    return all(process_state(int(tid)) in (None, "T", "t") for tid in tids)


def gated_forks(pid: int, argv: bytes) -> list[int]:
    """pid's children waiting in the gate's read, its argv still (not ld.so --list, not the command)."""
    forked, tasks = [], []
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    for task in tasks:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for child in (task / "children").read_text().split():
                waits = Path(f"/proc/{child}/wchan").read_text().endswith("pipe_read")
                if waits and Path(f"/proc/{child}/cmdline").read_bytes() == argv:
                    forked.append(int(child))
    return forked


@pytest.mark.parametrize("engine", ["bpf", "preload"])
def test_a_command_that_cannot_run_is_one_line(tmp_path, engine):
    script = tmp_path / "script"
    script.write_text("#!/nonexistent/interpreter\n")
    script.chmod(0o755)
    result = run_command(["-c", str(script), "--engine", engine, "3600"])
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("leaktrace: cannot ") and line.endswith(": No such file or directory"), line


def test_a_command_whose_leaktrace_is_killed_before_it_starts_is_not_left_waiting(tmp_path):
    """SIGKILL while the BPF engine compiles, its command forked and waiting for the gate: the
    command holds no end of the gate that would keep it waiting, so it runs and exits (it hung
    in the gate's read for good, an orphan)."""
    marker = tmp_path / "ran"
    argv = leaktrace_command("-c", f"touch {marker}", "3600")
    tool = subprocess.Popen(argv, stderr=(tmp_path / "stderr").open("w"))
    own = b"".join(arg.encode() + b"\0" for arg in argv)  # its /proc cmdline read at once did not always match
    deadline = time.monotonic() + TIMEOUT
    forked: list[int] = []
    try:
        while not forked:  # confirmed while leaktrace is stopped, so it cannot open the gate in between
            assert time.monotonic() < deadline and tool.poll() is None, (tmp_path / "stderr").read_text()
            if gated_forks(tool.pid, own):  # each stop and go may cost its BPF load a retry (EAGAIN)
                tool.send_signal(signal.SIGSTOP)
                while not all_threads_stopped(tool.pid):
                    time.sleep(0.001)
                forked = gated_forks(tool.pid, own)
                if not forked:
                    tool.send_signal(signal.SIGCONT)
            time.sleep(0.005)
    finally:
        tool.kill()
        tool.wait()
    [command] = forked
    deadline = time.monotonic() + 10
    while process_state(command) not in (None, "Z") or not marker.exists():  # an orphan's zombie is init's to reap
        assert time.monotonic() < deadline, f"command {command} still waits (or never ran)"
        time.sleep(0.05)
