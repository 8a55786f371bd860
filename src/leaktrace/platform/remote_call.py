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
from dataclasses import dataclass, field

from leaktrace.errors import RuntimeFailure
from leaktrace.platform.arch import HOST
from leaktrace.platform.process import live_thread, proc_path, status_field, zombie
from leaktrace.platform.ptrace import (
    PTRACE_CONT,
    PTRACE_DETACH,
    PTRACE_EVENT_STOP,
    PTRACE_GETREGSET,
    PTRACE_GETSIGMASK,
    PTRACE_INTERRUPT,
    PTRACE_SEIZE,
    PTRACE_SETREGSET,
    PTRACE_SETSIGMASK,
    REGS,
    WALL,
    BlockedCall,
    IoVec,
    call_at_stop,
    call_before_interrupt,
    ptrace,
    read_registers,
    restart_interrupted_wait,
    write_registers,
)

VECTOR_ROOM = 1 << 16  # bytes: more than any x86-64 XSAVE area or arm64 SVE state today
SEGV_BIT = 1 << (signal.SIGSEGV - 1)  # in a signal mask word
WAITING_CALLS = HOST.waiting_call_numbers  # a thread blocked in one holds no lock of the allocator or the loader
MINUS_ONE = (1 << 64) - 1  # an argument of -1 (a bare -1 names the copied data), or no system call


@dataclass
class _HeldThread:
    """A seized thread's state as found: put back at release."""

    registers: tuple[int, ...]
    call_before: BlockedCall | None  # the call it slept in before the interrupt, as /proc read it
    vectors: list[tuple[int, ctypes.Array[ctypes.c_uint8], IoVec]] = field(default_factory=list)


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
                found = self._seize_if_safe(pid, tid, forbidden, deadline)
                if found is not None:
                    self.tid, self._held = tid, found
                    self._mask = ctypes.c_uint64()
                    try:
                        self._save_vectors()
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

    def _save_vectors(self) -> None:
        """The thread's vector state, each regset the machine has (arm64's SVE only where the CPU has it)."""
        for note in REGS.vector_regsets:
            room = (ctypes.c_uint8 * VECTOR_ROOM)()
            vector = IoVec(ctypes.addressof(room), VECTOR_ROOM)
            try:
                ptrace(PTRACE_GETREGSET, self.tid, note, ctypes.addressof(vector))
            except OSError as e:
                if e.errno in (errno.EINVAL, errno.ENODEV) and note != REGS.vector_regsets[0]:
                    continue  # a regset this CPU lacks
                raise
            self._held.vectors.append((note, room, vector))  # the kernel set its length to what it wrote

    @staticmethod
    def _seize_if_safe(pid: int, tid: int, forbidden: list[tuple[int, int]], deadline: float) -> _HeldThread | None:
        try:
            ptrace(PTRACE_SEIZE, tid)
        except OSError as e:
            # A thread that exits between its listing and the seize: ESRCH, or EPERM once it is
            # exiting (the kernel refuses to attach to a task with an exit state).
            if e.errno == errno.ESRCH or (e.errno == errno.EPERM and zombie(tid)):
                return None
            raise RuntimeFailure(f"cannot seize thread {tid}: {e.strerror}") from None
        held = None
        try:
            before = call_before_interrupt(pid, tid)
            ptrace(PTRACE_INTERRUPT, tid)
            status = _wait_stop(tid, deadline + 1)
            if status is None or not os.WIFSTOPPED(status):
                return None
            if status >> 16 != PTRACE_EVENT_STOP or os.WSTOPSIG(status) != signal.SIGTRAP:
                # A signal came first (handed on), or a group stop: not this thread now.
                ptrace(PTRACE_DETACH, tid, None, 0 if status >> 16 else os.WSTOPSIG(status))
                return None
            regs = read_registers(tid)
            number = call_at_stop(regs, before)
            outside = not any(start <= regs[REGS.pc] < end for start, end in forbidden)
            if (number is not None and number in WAITING_CALLS) or (number is None and outside):
                held = _HeldThread(tuple(regs), before)
            elif restart_interrupted_wait(regs, before):
                write_registers(tid, regs)
        except OSError:
            return None
        finally:
            if held is None:
                with contextlib.suppress(OSError):
                    ptrace(PTRACE_DETACH, tid, None, 0)
        return held

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
        arguments may name the copy's address as -1. Returns (its return value, the copy's address)."""
        saved = self._held.registers
        top = self.stack_top if self.stack_top is not None else saved[REGS.sp] - HOST.red_zone
        data_address = (top - len(data)) & ~15
        self.write(data_address, data)
        regs = (ctypes.c_ulonglong * REGS.words)(*saved)
        stack = (data_address - 64) & ~15
        if REGS.link is None:  # the return address pushed: 0, where the call's end faults
            stack -= 8  # at entry sp + 8 is 16-byte aligned
            self.write(stack, b"\0" * 8)
        else:
            regs[REGS.link] = 0
        for word, value in zip(REGS.arguments, arguments):
            regs[word] = data_address if value == -1 else value % (1 << 64)
        regs[REGS.pc], regs[REGS.sp] = function, stack
        regs[REGS.flags] &= ~REGS.flags_cleared_for_call
        if REGS.syscall is not None:  # no restart of the call the thread was woken from
            regs[REGS.result], regs[REGS.syscall] = 0, MINUS_ONE
        write_registers(self.tid, regs)
        ptrace(PTRACE_CONT, self.tid, None, 0)
        deadline = time.monotonic() + timeout
        while True:
            status = _wait_stop(self.tid, deadline)
            if status is None:
                raise RuntimeFailure(f"a call in pid {self.pid} did not return within {timeout:g} s")
            if not os.WIFSTOPPED(status):
                raise RuntimeFailure(f"pid {self.pid} ended during a call into it")
            stop = os.WSTOPSIG(status)
            regs = read_registers(self.tid)
            if stop == signal.SIGSEGV and regs[REGS.pc] == 0:
                return regs[REGS.result], data_address
            # Another signal: delivered (its handler runs on this stack, below the call); an
            # event or group stop: resumed.
            ptrace(PTRACE_CONT, self.tid, None, 0 if status >> 16 else stop)

    def release(self) -> None:
        """The thread's registers, vector state and signal mask back, and the thread let go."""
        try:
            regs = (ctypes.c_ulonglong * REGS.words)(*self._held.registers)
            restart_interrupted_wait(regs, self._held.call_before)
            with contextlib.suppress(OSError):
                try:
                    write_registers(self.tid, regs)
                except OSError:  # running still (a call that timed out): stopped first, its call abandoned
                    ptrace(PTRACE_INTERRUPT, self.tid)
                    _wait_stop(self.tid, time.monotonic() + 1)
                    write_registers(self.tid, regs)
                for note, _, vector in self._held.vectors:
                    ptrace(PTRACE_SETREGSET, self.tid, note, ctypes.addressof(vector))
                ptrace(PTRACE_SETSIGMASK, self.tid, 8, ctypes.addressof(self._mask))
            with contextlib.suppress(OSError):
                ptrace(PTRACE_DETACH, self.tid, None, 0)
        finally:
            os.close(self._mem)
