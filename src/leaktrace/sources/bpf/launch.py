"""A command leaktrace starts: forked, held at a gate until the probes are live, and
continued by a process of its own should leaktrace die while the BPF program holds it stopped
(as are the programs the BPF program holds for their unwind tables under -f and --all)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from leaktrace.abi.layout import HOLD_RELEASED
from leaktrace.platform.arch import HOST
from leaktrace.platform.process import launch
from leaktrace.sources.bpf.stop_owners import open_stop_owners


def spawn_gated(path: str, argv: list[str]) -> tuple[int, int, int]:
    """Forks a child that execs argv once the gate is written; returns (pid, gate, errors)."""
    gate_r, gate_w = os.pipe2(os.O_CLOEXEC)  # no program leaktrace starts holds it: its death opens the gate
    try:
        pid, err_r = launch(path, argv, gate=(gate_r, gate_w))
    finally:
        os.close(gate_r)
    return pid, gate_w, err_r


# Run by a process of its own (a SIGKILL of leaktrace does not reach it, nor terminal signals):
# when leaktrace dies without letting its command go, the BPF program may have left the
# command stopped (SIGSTOP at _exit or at a new image's first allocator call), and the
# programs in the holds map (fd holds, -1: none), held for their tables or in _exit: each is
# continued, again and again for as long as leaktrace's links may take to be detached. Its
# entries in the shared stop_owners map (fd owners) go first; a process another live
# leaktrace still holds stopped is left to that one.
_CONTINUER = """
import ctypes, os, signal, struct, sys, time
command, command_pid, leaktrace, holds, owners, stopper, sys_bpf, released = (int(arg) for arg in sys.argv[1:9])
if os.read(leaktrace, 1):
    sys.exit(0)
libc = ctypes.CDLL(None, use_errno=True)

def bpf(command, *fields):
    packed = struct.pack("<IIQQQ", *fields)
    return libc.syscall(sys_bpf, command, ctypes.create_string_buffer(packed, len(packed)), len(packed)) == 0

def entries(fd):
    key, following, value = (ctypes.create_string_buffer(8) for _ in range(3))
    found, at = [], 0
    while len(found) < 1 << 16 and bpf(4, fd, 0, at, ctypes.addressof(following), 0):
        key.raw, at = following.raw, ctypes.addressof(key)
        if bpf(1, fd, 0, at, ctypes.addressof(value), 0):
            found.append((key.raw, value.raw))
    return found

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False

def held_by_others(pid):
    return any(
        tgid == pid and other != stopper and alive(other)
        for tgid, other in (struct.unpack("<II", key) for key, _ in entries(owners))
    )

def let_go(pid):
    if not held_by_others(pid):
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

deadline = time.monotonic() + 2
while time.monotonic() < deadline:
    mine = []
    for key, _ in entries(owners):
        tgid, other = struct.unpack("<II", key)
        if other == stopper:
            bpf(3, owners, 0, ctypes.addressof(ctypes.create_string_buffer(key, 8)), 0, 0)
            mine.append(tgid)
    if command >= 0 and not held_by_others(command_pid):
        try:
            signal.pidfd_send_signal(command, signal.SIGCONT)
        except ProcessLookupError:
            command = -1
    held = entries(holds) if holds >= 0 else []
    waiting = [struct.unpack_from("<I", key)[0] for key, value in held if struct.unpack("<II", value)[1] != released]
    for pid in mine + waiting:
        if pid != command_pid:
            let_go(pid)
    time.sleep(0.02)
"""


class StopRelease:
    """Makes sure a command the BPF program may stop (pid), and the programs it holds for their
    tables (holds_fd: the holds map), are continued if leaktrace dies: a small process holds a
    pidfd of the command, the maps, and the read end of a pipe only leaktrace writes; leaktrace's
    death closes the pipe, and each that no other leaktrace holds is sent SIGCONT. release()
    says they were let go."""

    def __init__(self, pid: int | None = None, holds_fd: int | None = None):
        pidfd = os.pidfd_open(pid) if pid is not None else -1
        owners = open_stop_owners()
        read_end, self._write_end = os.pipe2(os.O_CLOEXEC)
        passed = tuple(fd for fd in (pidfd, holds_fd, read_end, owners) if fd is not None and fd >= 0)
        arguments = (
            pidfd,
            pid or -1,
            read_end,
            holds_fd or -1,
            owners,
            os.getpid(),
            HOST.syscalls["bpf"],
            HOLD_RELEASED,
        )
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _CONTINUER] + [str(argument) for argument in arguments],
                pass_fds=passed,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        finally:
            for fd in (pidfd, owners):
                if fd >= 0:
                    os.close(fd)
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
