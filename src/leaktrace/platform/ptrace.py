"""ptrace(2) through ctypes, and the requests and flags leaktrace uses (x86-64 Linux)."""

from __future__ import annotations

import ctypes
import errno
import os

from leaktrace.platform.arch import HOST, USER_REGS

EINTR_WAITS = HOST.eintr_wait_numbers

PTRACE_CONT, PTRACE_GETREGS, PTRACE_SETREGS, PTRACE_DETACH = 7, 12, 13, 17
PTRACE_GETREGSET, PTRACE_SETREGSET, PTRACE_SEIZE, PTRACE_INTERRUPT = 0x4204, 0x4205, 0x4206, 0x4207
PTRACE_GETSIGMASK, PTRACE_SETSIGMASK = 0x420A, 0x420B
PTRACE_EVENT_STOP = 128  # the stop PTRACE_INTERRUPT (and a group stop) reports, in status >> 16
WALL = 0x40000000  # waitpid's __WALL: threads too

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]


def resume_interrupted_wait(tid: int) -> None:
    """restart_interrupted_wait on a thread in a ptrace stop (nothing if it is not in one)."""
    regs = (ctypes.c_ulonglong * USER_REGS.words)()
    try:
        ptrace(PTRACE_GETREGS, tid, None, ctypes.addressof(regs))
        if regs[USER_REGS.syscall] in EINTR_WAITS:
            restart_interrupted_wait(regs)
            ptrace(PTRACE_SETREGS, tid, None, ctypes.addressof(regs))
    except OSError:
        pass


def restart_interrupted_wait(regs: ctypes.Array[ctypes.c_ulonglong]) -> None:
    """Registers of a thread that leaktrace's interrupt woke from a wait the kernel ends with
    EINTR: rewound to run the wait again, so the program never sees the interruption."""
    if regs[USER_REGS.syscall] in EINTR_WAITS and regs[USER_REGS.result] == (1 << 64) - errno.EINTR:
        regs[USER_REGS.pc] -= USER_REGS.syscall_bytes
        regs[USER_REGS.result] = regs[USER_REGS.syscall]


def ptrace(request: int, tid: int, address: int | None = None, data: int | None = None) -> int:
    """ptrace(2); OSError on failure."""
    result = _libc.ptrace(request, tid, address, data)
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(result)
