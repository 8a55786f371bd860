"""ptrace(2) through ctypes: the requests and flags leaktrace uses, a thread's registers as the
machine's table lays them out, and the system call a thread stopped by PTRACE_INTERRUPT stands in."""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass

from leaktrace.platform.arch import HOST

REGS = HOST.registers
EINTR_WAITS = HOST.eintr_wait_numbers

PTRACE_CONT, PTRACE_GETREGS, PTRACE_SETREGS, PTRACE_DETACH = 7, 12, 13, 17
PTRACE_GETREGSET, PTRACE_SETREGSET, PTRACE_SEIZE, PTRACE_INTERRUPT = 0x4204, 0x4205, 0x4206, 0x4207
PTRACE_GETSIGMASK, PTRACE_SETSIGMASK = 0x420A, 0x420B
PTRACE_EVENT_STOP = 128  # the stop PTRACE_INTERRUPT (and a group stop) reports, in status >> 16
WALL = 0x40000000  # waitpid's __WALL: threads too
NT_PRSTATUS = 1
SYSCALL_LINE_LIMIT = 512  # bytes of /proc/TID/syscall: a number, six arguments, sp and pc
MINUS_EINTR = (1 << 64) - errno.EINTR
TIMER_ABSTIME = 1
FUTEX_CMD_MASK, FUTEX_WAITS = 0x7F, frozenset({0, 9})  # FUTEX_WAIT, FUTEX_WAIT_BITSET

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]

Registers = ctypes.Array[ctypes.c_ulonglong]


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


def ptrace(request: int, tid: int, address: int | None = None, data: int | None = None) -> int:
    """ptrace(2); OSError on failure."""
    result = _libc.ptrace(request, tid, address, data)
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(result)


def read_registers(tid: int) -> Registers:
    """The general registers of a thread in a ptrace stop, REGS's words."""
    regs = (ctypes.c_ulonglong * REGS.words)()
    if REGS.by_regset:
        vector = IoVec(ctypes.addressof(regs), ctypes.sizeof(regs))
        ptrace(PTRACE_GETREGSET, tid, NT_PRSTATUS, ctypes.addressof(vector))
    else:
        ptrace(PTRACE_GETREGS, tid, None, ctypes.addressof(regs))
    return regs


def write_registers(tid: int, regs: Registers) -> None:
    if REGS.by_regset:
        vector = IoVec(ctypes.addressof(regs), ctypes.sizeof(regs))
        ptrace(PTRACE_SETREGSET, tid, NT_PRSTATUS, ctypes.addressof(vector))
    else:
        ptrace(PTRACE_SETREGS, tid, None, ctypes.addressof(regs))


@dataclass(frozen=True)
class BlockedCall:
    """The system call a thread sleeps in, as /proc/PID/task/TID/syscall shows it: read before
    the thread is interrupted, since aarch64's kernel forgets the number, and the first argument
    under the return value, before a ptrace stop."""

    number: int
    arguments: tuple[int, ...]
    sp: int
    pc: int  # just past the system call instruction


def blocked_call(pid: int, tid: int) -> BlockedCall | None:
    """The call tid sleeps in, None if it runs or is in none (a bounded read of the kernel's line)."""
    try:
        fd = os.open(f"/proc/{pid}/task/{tid}/syscall", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        words = os.read(fd, SYSCALL_LINE_LIMIT).split()
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(words) != 9 or not words[0].isdigit():  # "running", or "-1 sp pc" outside a call
        return None
    values = [int(word, 16) for word in words[1:]]
    return BlockedCall(int(words[0]), tuple(values[:6]), values[6], values[7])


def call_before_interrupt(pid: int, tid: int) -> BlockedCall | None:
    """blocked_call, read just before PTRACE_INTERRUPT where the stop's registers will not name
    the call (aarch64); None where they do."""
    return blocked_call(pid, tid) if REGS.syscall is None else None


def call_at_stop(regs: Registers | tuple[int, ...], before: BlockedCall | None) -> int | None:
    """The system call a thread stopped by PTRACE_INTERRUPT stands in (woken from it: ended with
    EINTR, or rewound by the kernel to run it again), None if it was running its own code."""
    if REGS.syscall is not None:
        number = regs[REGS.syscall]
        return number if number < 1 << 63 else None
    if before is None or regs[REGS.sp] != before.sp or regs[REGS.number] != before.number:
        return None
    same = all(regs[word] == value for word, value in zip(REGS.arguments[1:], before.arguments[1:]))
    if same and regs[REGS.pc] in (before.pc, before.pc - REGS.syscall_bytes):
        return before.number
    return None


def _restarts_by_block(call: BlockedCall) -> bool:
    """Whether the kernel left an interrupted call to restart_syscall (-ERESTART_RESTARTBLOCK:
    a relative sleep, a futex wait with a timeout), where running it again would wait anew."""
    names = HOST.syscalls
    if call.number == names["clock_nanosleep"]:
        return not call.arguments[1] & TIMER_ABSTIME
    if call.number == names["futex"]:
        return call.arguments[1] & FUTEX_CMD_MASK in FUTEX_WAITS and call.arguments[3] != 0
    return call.number == names["nanosleep"]


def restart_interrupted_wait(regs: Registers, before: BlockedCall | None) -> bool:
    """Registers of a thread that leaktrace's interrupt woke from a system call, set to run the
    call on as if never woken: a wait the kernel ended with EINTR is rewound to run again, and
    where the number is forgotten (aarch64), a rewound sleep goes on through restart_syscall.
    Whether they were changed."""
    number = call_at_stop(regs, before)
    if number is None:
        return False
    rewound = before is not None and regs[REGS.pc] != before.pc  # by the kernel, to run the call again (aarch64)
    if number in EINTR_WAITS and regs[REGS.result] == MINUS_EINTR and not rewound:
        regs[REGS.pc] -= REGS.syscall_bytes
        # What lay under the return value: the first argument (aarch64's x0), or the number (x86-64's rax).
        regs[REGS.result] = before.arguments[0] if before is not None else number
        return True
    if before is not None and rewound and _restarts_by_block(before):
        regs[REGS.number] = HOST.syscalls["restart_syscall"]
        return True
    return False


def resume_interrupted_wait(tid: int, before: BlockedCall | None) -> None:
    """restart_interrupted_wait on a thread in a ptrace stop (nothing if it is not in one)."""
    try:
        regs = read_registers(tid)
        if restart_interrupted_wait(regs, before):
            write_registers(tid, regs)
    except OSError:
        pass
