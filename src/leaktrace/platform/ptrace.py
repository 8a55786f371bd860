"""ptrace(2) through ctypes, and the requests and flags leaktrace uses (x86-64 Linux)."""

from __future__ import annotations

import ctypes
import os

PTRACE_CONT, PTRACE_GETREGS, PTRACE_SETREGS, PTRACE_DETACH = 7, 12, 13, 17
PTRACE_GETREGSET, PTRACE_SETREGSET, PTRACE_SEIZE, PTRACE_INTERRUPT = 0x4204, 0x4205, 0x4206, 0x4207
PTRACE_EVENT_STOP = 128  # the stop PTRACE_INTERRUPT (and a group stop) reports, in status >> 16
WALL = 0x40000000  # waitpid's __WALL: threads too

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]


def ptrace(request: int, tid: int, address: int | None = None, data: int | None = None) -> int:
    """ptrace(2); OSError on failure."""
    result = _libc.ptrace(request, tid, address, data)
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(result)
