"""A command leaktrace starts: forked, held at a gate until the probes are live, and
continued by a process of its own should leaktrace die while the BPF program holds it stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def spawn_gated(path: str, argv: list[str]) -> tuple[int, int, int]:
    """Forks a child that execs argv once the gate is written; returns (pid, gate, errors)."""
    gate_r, gate_w = os.pipe()
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # child: nothing here may raise past os._exit
        try:
            os.close(gate_w)
            os.close(err_r)
            os.read(gate_r, 1)
            os.close(gate_r)
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            os.execv(path, argv)
        except OSError as e:
            os.write(err_w, os.strerror(e.errno).encode())
        finally:
            os._exit(127)
    os.close(gate_r)
    os.close(err_w)
    return pid, gate_w, err_r


# Run by a process of its own (a SIGKILL of leaktrace does not reach it, nor terminal signals):
# when leaktrace dies without letting its command go, the BPF program may have left the
# command stopped (SIGSTOP at _exit or at a new image's first allocator call): it is
# continued, again and again for as long as leaktrace's links may take to be detached.
_CONTINUER = """
import os, signal, sys, time
command, leaktrace = int(sys.argv[1]), int(sys.argv[2])
if os.read(leaktrace, 1):
    sys.exit(0)
deadline = time.monotonic() + 2
while time.monotonic() < deadline:
    try:
        signal.pidfd_send_signal(command, signal.SIGCONT)
    except ProcessLookupError:
        break
    time.sleep(0.02)
"""


class StopRelease:
    """Makes sure a command the BPF program may stop is continued if leaktrace dies: a small
    process holds a pidfd of the command and the read end of a pipe only leaktrace writes;
    leaktrace's death closes the pipe, and the command is sent SIGCONT. release() says the
    command was let go (nothing to do)."""

    def __init__(self, pid: int):
        pidfd = os.pidfd_open(pid)
        read_end, self._write_end = os.pipe2(os.O_CLOEXEC)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _CONTINUER, str(pidfd), str(read_end)],
                pass_fds=(pidfd, read_end),
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        finally:
            os.close(pidfd)
            os.close(read_end)

    def release(self) -> None:
        if self._write_end >= 0:
            os.write(self._write_end, b"x")
            os.close(self._write_end)
            self._write_end = -1
            self._process.wait()


def reap(pid: int, kill: bool) -> None:
    try:
        if kill:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
