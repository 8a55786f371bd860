"""A command leaktrace starts: forked, held at a gate until the probes are live, and
continued by a process of its own should leaktrace die while the BPF program holds it stopped
(as are the programs the BPF program holds for their unwind tables under -f and --all)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from leaktrace.platform.arch import SYS_BPF
from leaktrace.sources.bpf.layout import HOLD_RELEASED


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
# command stopped (SIGSTOP at _exit or at a new image's first allocator call), and the
# programs in the holds map (fd holds, -1: none), held for their tables or in _exit: each is
# continued, again and again for as long as leaktrace's links may take to be detached.
_CONTINUER = """
import ctypes, os, signal, struct, sys, time
command, leaktrace, holds, sys_bpf, released = (int(arg) for arg in sys.argv[1:6])
if os.read(leaktrace, 1):
    sys.exit(0)
libc = ctypes.CDLL(None, use_errno=True)

def bpf(command, *fields):
    packed = struct.pack("<IIQQQ", *fields)
    return libc.syscall(sys_bpf, command, ctypes.create_string_buffer(packed, len(packed)), len(packed)) == 0

def waiting():
    key, following, value = (ctypes.create_string_buffer(8) for _ in range(3))
    found, at = [], 0
    while len(found) < 1 << 16 and bpf(4, holds, 0, at, ctypes.addressof(following), 0):
        key.raw, at = following.raw, ctypes.addressof(key)
        if bpf(1, holds, 0, at, ctypes.addressof(value), 0) and struct.unpack("<II", value.raw)[1] != released:
            found.append(struct.unpack_from("<I", key.raw)[0])
    return found

deadline = time.monotonic() + 2
while time.monotonic() < deadline:
    if command >= 0:
        try:
            signal.pidfd_send_signal(command, signal.SIGCONT)
        except ProcessLookupError:
            command = -1
    for pid in waiting() if holds >= 0 else ():
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    time.sleep(0.02)
"""


class StopRelease:
    """Makes sure a command the BPF program may stop (pid), and the programs it holds for their
    tables (holds_fd: the holds map), are continued if leaktrace dies: a small process holds a
    pidfd of the command, the map, and the read end of a pipe only leaktrace writes; leaktrace's
    death closes the pipe, and each is sent SIGCONT. release() says they were let go."""

    def __init__(self, pid: int | None = None, holds_fd: int | None = None):
        pidfd = os.pidfd_open(pid) if pid is not None else -1
        read_end, self._write_end = os.pipe2(os.O_CLOEXEC)
        passed = tuple(fd for fd in (pidfd, holds_fd, read_end) if fd is not None and fd >= 0)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _CONTINUER]
                + [str(pidfd), str(read_end), str(holds_fd or -1), str(SYS_BPF), str(HOLD_RELEASED)],
                pass_fds=passed,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        finally:
            if pidfd >= 0:
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
