"""Calling a function inside another process with nothing but ptrace, as a debugger's `call`
does: one thread is seized where it holds no lock of the allocator or the loader (blocked in a
system call that waits, or running code outside them), its registers and vector state are
saved, it runs the function (on its own stack below the red zone, or on one the caller mapped
in the process) with a return address of 0, and once that return faults it gets its
registers and signal mask back and is let go; the process's other threads run on meanwhile,
so a lock one of them holds is released as usual.

The fault is never delivered, and SIGSEGV is unblocked in the held thread for the call: the
kernel resets the handler of a fault signal the thread blocks (or the process ignores) to
the default, which would kill a program whose own SIGSEGV handler is part of its design.

If leaktrace dies during the call, the thread faults at address 0 with no one to catch it:
callers keep that window to the call itself (milliseconds)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import time
from collections.abc import Iterable

from leaktrace.errors import RuntimeFailure
from leaktrace.platform.arch import HOST, USER_REGS
from leaktrace.platform.process import live_thread, proc_path, status_field, zombie
from leaktrace.platform.ptrace import (
    PTRACE_CONT,
    PTRACE_DETACH,
    PTRACE_EVENT_STOP,
    PTRACE_GETREGS,
    PTRACE_GETREGSET,
    PTRACE_GETSIGMASK,
    PTRACE_INTERRUPT,
    PTRACE_SEIZE,
    PTRACE_SETREGS,
    PTRACE_SETREGSET,
    PTRACE_SETSIGMASK,
    WALL,
    ptrace,
    restart_interrupted_wait,
)

NT_X86_XSTATE = 0x202
XSTATE_ROOM = 1 << 14  # bytes: more than any x86-64 XSAVE area today
SEGV_BIT = 1 << (signal.SIGSEGV - 1)  # in a signal mask word
# struct user_regs_struct's words that a call sets (System V: arguments in rdi, rsi, rdx, rcx, r8, r9).
R9, R8, RAX, RCX, RDX, RSI, RDI, ORIG_RAX, RIP, RSP = 8, 9, 10, 11, 12, 13, 14, 15, 16, 19
ARGUMENT_WORDS = (RDI, RSI, RDX, RCX, R8, R9)
# System calls a thread blocks in without holding a lock of the allocator or the loader.
WAITING_CALLS = frozenset(
    {0, 7, 23, 34, 35, 43, 45, 47, 61, 128, 130, 202, 230, 232, 270, 271, 281, 288, 299, 441}
)  # read poll select pause nanosleep accept recvfrom recvmsg wait4 rt_sigtimedwait rt_sigsuspend
#    futex clock_nanosleep epoll_wait pselect6 ppoll epoll_pwait accept4 recvmmsg epoll_pwait2


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


def _wait_stop(tid: int, deadline: float) -> int | None:
    """The thread's next wait status, None at the deadline."""
    while time.monotonic() < deadline:
        done, status = os.waitpid(tid, os.WNOHANG | WALL)
        if done:
            return status
        time.sleep(0.0002)
    return None


def _threads(pid: int) -> list[int]:
    try:
        return sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        raise RuntimeFailure(f"pid {pid} has exited") from None


class RemoteCaller:
    """One thread of pid held for calls into the process, until release()."""

    def __init__(self, pid: int, forbidden: Iterable[tuple[int, int]], timeout: float = 2.0):
        """Seizes a thread whose state is safe for a call: none inside forbidden (code ranges of
        the allocator and the loader) unless blocked in a waiting system call. Tries every
        thread, again and again, until timeout."""
        self.pid = pid
        if int(status_field(f"{pid}/task/{live_thread(pid) or pid}", "SigIgn") or "0", 16) & SEGV_BIT:
            raise RuntimeFailure(f"pid {pid} ignores SIGSEGV: the fault that ends a call would reset that")
        self.stack_top: int | None = None  # where calls run; None: below the held thread's red zone
        forbidden = list(forbidden)
        deadline = time.monotonic() + timeout
        while True:
            for tid in _threads(pid):
                if zombie(tid):  # a thread that has exited, as a main thread after pthread_exit
                    continue
                found = self._seize_if_safe(tid, forbidden, deadline)
                if found is not None:
                    self.tid, self._saved = tid, found
                    self._xstate = (ctypes.c_uint8 * XSTATE_ROOM)()
                    self._xstate_vector = _IoVec(ctypes.addressof(self._xstate), XSTATE_ROOM)
                    self._mask = ctypes.c_uint64()
                    try:
                        ptrace(PTRACE_GETREGSET, tid, NT_X86_XSTATE, ctypes.addressof(self._xstate_vector))
                        ptrace(PTRACE_GETSIGMASK, tid, 8, ctypes.addressof(self._mask))
                        unblocked = ctypes.c_uint64(self._mask.value & ~SEGV_BIT)
                        ptrace(PTRACE_SETSIGMASK, tid, 8, ctypes.addressof(unblocked))
                        self._mem = os.open(proc_path(pid, "mem"), os.O_RDWR)
                    except OSError:
                        with contextlib.suppress(OSError):
                            ptrace(PTRACE_DETACH, tid, None, 0)
                        raise
                    return
            if time.monotonic() > deadline:
                raise RuntimeFailure(
                    f"no thread of pid {pid} came to a point where a call is safe within {timeout:g} s "
                    "(each was inside the allocator or the loader)"
                )
            time.sleep(0.005)

    @staticmethod
    def _seize_if_safe(tid: int, forbidden: list[tuple[int, int]], deadline: float) -> tuple[int, ...] | None:
        try:
            ptrace(PTRACE_SEIZE, tid)
        except OSError as e:
            # A thread that exits between its listing and the seize: ESRCH, or EPERM once it is
            # exiting (the kernel refuses to attach to a task with an exit state).
            if e.errno == errno.ESRCH or (e.errno == errno.EPERM and zombie(tid)):
                return None
            raise RuntimeFailure(f"cannot seize thread {tid}: {e.strerror}") from None
        registers = None
        try:
            ptrace(PTRACE_INTERRUPT, tid)
            status = _wait_stop(tid, deadline + 1)
            if status is None or not os.WIFSTOPPED(status):
                return None
            if status >> 16 != PTRACE_EVENT_STOP or os.WSTOPSIG(status) != signal.SIGTRAP:
                # A signal came first (handed on), or a group stop: not this thread now.
                ptrace(PTRACE_DETACH, tid, None, 0 if status >> 16 else os.WSTOPSIG(status))
                return None
            regs = (ctypes.c_ulonglong * USER_REGS.words)()
            ptrace(PTRACE_GETREGS, tid, None, ctypes.addressof(regs))
            in_call = regs[ORIG_RAX] < 1 << 63
            outside = not any(start <= regs[RIP] < end for start, end in forbidden)
            if (in_call and regs[ORIG_RAX] in WAITING_CALLS) or (not in_call and outside):
                registers = tuple(regs)
        except OSError:
            return None
        finally:
            if registers is None:
                with contextlib.suppress(OSError):
                    ptrace(PTRACE_DETACH, tid, None, 0)
        return registers

    def write(self, address: int, data: bytes) -> None:
        if os.pwrite(self._mem, data, address) != len(data):
            raise RuntimeFailure(f"cannot write pid {self.pid}'s memory at {address:#x}")

    def read(self, address: int, size: int, exact: bool = False) -> bytes:
        """Up to size bytes at address (all of them when exact)."""
        data = os.pread(self._mem, size, address)
        if exact and len(data) != size:
            raise RuntimeFailure(f"cannot read pid {self.pid}'s memory at {address:#x}")
        return data

    def call(self, function: int, arguments: list[int], data: bytes = b"", timeout: float = 10.0) -> tuple[int, int]:
        """Runs function(*arguments) in the held thread with data copied onto its stack first;
        arguments may name the copy's address as -1. Returns (rax, the copy's address)."""
        saved = self._saved
        top = self.stack_top if self.stack_top is not None else saved[RSP] - HOST.red_zone
        data_address = (top - len(data)) & ~15
        stack = ((data_address - 64) & ~15) - 8  # at entry rsp + 8 is 16-byte aligned
        self.write(data_address, data)
        self.write(stack, b"\0" * 8)  # the return address: 0, where the call's end faults
        regs = (ctypes.c_ulonglong * USER_REGS.words)(*saved)
        for word, value in zip(ARGUMENT_WORDS, arguments):
            regs[word] = data_address if value == -1 else value % (1 << 64)
        regs[RIP], regs[RSP], regs[RAX], regs[ORIG_RAX] = function, stack, 0, (1 << 64) - 1  # no restart
        ptrace(PTRACE_SETREGS, self.tid, None, ctypes.addressof(regs))
        ptrace(PTRACE_CONT, self.tid, None, 0)
        deadline = time.monotonic() + timeout
        while True:
            status = _wait_stop(self.tid, deadline)
            if status is None:
                raise RuntimeFailure(f"a call in pid {self.pid} did not return within {timeout:g} s")
            if not os.WIFSTOPPED(status):
                raise RuntimeFailure(f"pid {self.pid} ended during a call into it")
            stop = os.WSTOPSIG(status)
            ptrace(PTRACE_GETREGS, self.tid, None, ctypes.addressof(regs))
            if stop == signal.SIGSEGV and regs[RIP] == 0:
                return regs[RAX], data_address
            # Another signal: delivered (its handler runs on this stack, below the call); an
            # event or group stop: resumed.
            ptrace(PTRACE_CONT, self.tid, None, 0 if status >> 16 else stop)

    def release(self) -> None:
        """The thread's registers, vector state and signal mask back, and the thread let go."""
        try:
            regs = (ctypes.c_ulonglong * USER_REGS.words)(*self._saved)
            restart_interrupted_wait(regs)
            with contextlib.suppress(OSError):
                try:
                    ptrace(PTRACE_SETREGS, self.tid, None, ctypes.addressof(regs))
                except OSError:  # running still (a call that timed out): stopped first, its call abandoned
                    ptrace(PTRACE_INTERRUPT, self.tid)
                    _wait_stop(self.tid, time.monotonic() + 1)
                    ptrace(PTRACE_SETREGS, self.tid, None, ctypes.addressof(regs))
                ptrace(PTRACE_SETREGSET, self.tid, NT_X86_XSTATE, ctypes.addressof(self._xstate_vector))
                ptrace(PTRACE_SETSIGMASK, self.tid, 8, ctypes.addressof(self._mask))
            with contextlib.suppress(OSError):
                ptrace(PTRACE_DETACH, self.tid, None, 0)
        finally:
            os.close(self._mem)
