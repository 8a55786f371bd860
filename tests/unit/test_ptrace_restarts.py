"""How a thread that leaktrace's PTRACE_INTERRUPT woke from a system call is set to run it on, on
each machine's register layout: x86-64 names the call in orig_rax; aarch64 forgets it, so the
call read from /proc/TID/syscall before the interrupt is matched against the stop's registers.
(The arm64 VM runs the same on a real kernel: test_preload_attach.py's waits.)"""

from __future__ import annotations

import ctypes
import errno
import subprocess
import time

import pytest

from leaktrace.platform import ptrace
from leaktrace.platform.arch import AARCH64, X86_64, Arch
from leaktrace.platform.ptrace import BlockedCall, blocked_call, call_at_stop, restart_interrupted_wait

MINUS_EINTR = (1 << 64) - errno.EINTR
SP, PC = 0xFFFF_F000_1000, 0xAAAA_0000_2004  # pc: just past the svc


@pytest.fixture
def machine(monkeypatch):
    def use(table: Arch) -> None:
        monkeypatch.setattr(ptrace, "HOST", table)
        monkeypatch.setattr(ptrace, "REGS", table.registers)
        monkeypatch.setattr(ptrace, "EINTR_WAITS", table.eintr_wait_numbers)

    return use


def _arm64_stop(number: int, arguments: tuple[int, ...], pc: int, x0: int) -> ctypes.Array[ctypes.c_ulonglong]:
    regs = (ctypes.c_ulonglong * AARCH64.registers.words)()
    for word, value in enumerate(arguments):
        regs[word] = value
    regs[0], regs[8], regs[31], regs[32] = x0, number, SP, pc
    return regs


def _restarted(number: int, arguments: tuple[int, ...], pc: int, x0: int, before: BlockedCall | None) -> tuple:
    regs = _arm64_stop(number, arguments, pc, x0)
    restart_interrupted_wait(regs, before)
    return regs[0], regs[8], regs[32]


def test_an_eintr_wait_on_arm64_gets_its_first_argument_back_and_runs_its_svc_again(machine):
    machine(AARCH64)
    epoll_pwait = AARCH64.syscalls["epoll_pwait"]
    arguments = (5, 0x1000, 1, MINUS_EINTR + errno.EINTR - 1, 0, 8)
    before = BlockedCall(epoll_pwait, arguments, SP, PC)
    assert call_at_stop(_arm64_stop(epoll_pwait, arguments, PC, MINUS_EINTR), before) == epoll_pwait
    assert _restarted(epoll_pwait, arguments, PC, MINUS_EINTR, before) == (5, epoll_pwait, PC - 4)


@pytest.mark.parametrize(
    "name, arguments, goes_on_by_block",
    [
        ("clock_nanosleep", (1, 0, 0x1000, 0), True),  # relative: the time left is the kernel's
        ("clock_nanosleep", (1, 1, 0x1000, 0), False),  # TIMER_ABSTIME: run again, it ends on time
        ("nanosleep", (0x1000, 0), True),
        ("futex", (0x2000, 0x89, 0, 0x1000, 0, 0xFFFFFFFF), True),  # FUTEX_WAIT_BITSET_PRIVATE with a timeout
        ("futex", (0x2000, 0x80, 0, 0, 0, 0), False),  # FUTEX_WAIT_PRIVATE, no timeout
        ("read", (0, 0x1000, 1), False),
    ],
)
def test_a_call_the_arm64_kernel_rewound_runs_again_or_goes_on_by_restart_syscall(
    machine, name, arguments, goes_on_by_block
):
    machine(AARCH64)
    number = AARCH64.syscalls[name]
    before = BlockedCall(number, (*arguments, *(0,) * (6 - len(arguments))), SP, PC)
    arguments = before.arguments
    expected = AARCH64.syscalls["restart_syscall"] if goes_on_by_block else number
    assert _restarted(number, arguments, PC - 4, arguments[0], before) == (arguments[0], expected, PC - 4)


@pytest.mark.parametrize("differs", ["sp", "pc", "argument", "none read"])
def test_an_arm64_stop_that_is_not_the_call_read_before_is_left_as_it_is(machine, differs):
    """The thread ran on between the read and the interrupt: its registers are its own."""
    machine(AARCH64)
    epoll_pwait = AARCH64.syscalls["epoll_pwait"]
    arguments = (5, 0x1000, 1, 100, 0, 8)
    before = {
        "sp": BlockedCall(epoll_pwait, arguments, SP + 16, PC),
        "pc": BlockedCall(epoll_pwait, arguments, SP, PC + 8),
        "argument": BlockedCall(epoll_pwait, (5, 0x1000, 2, 100, 0, 8), SP, PC),
        "none read": None,
    }[differs]
    assert call_at_stop(_arm64_stop(epoll_pwait, arguments, PC, MINUS_EINTR), before) is None
    assert _restarted(epoll_pwait, arguments, PC, MINUS_EINTR, before) == (MINUS_EINTR, epoll_pwait, PC)


def test_an_eintr_wait_on_x86_64_is_rewound_by_orig_rax(machine):
    machine(X86_64)
    regs = (ctypes.c_ulonglong * X86_64.registers.words)()
    epoll_wait = X86_64.syscalls["epoll_wait"]
    regs[15], regs[10], regs[16] = epoll_wait, MINUS_EINTR, PC
    assert call_at_stop(regs, None) == epoll_wait
    restart_interrupted_wait(regs, None)
    assert (regs[10], regs[16]) == (epoll_wait, PC - 2)
    regs[15] = (1 << 64) - 1  # in no call: nothing to restart
    assert call_at_stop(regs, None) is None


def test_the_call_a_sleeping_process_is_in_is_read_from_proc():
    with subprocess.Popen(["sleep", "30"]) as child:
        try:
            sleeping, deadline = ptrace.HOST.syscalls["clock_nanosleep"], time.monotonic() + 5
            while (found := blocked_call(child.pid, child.pid)) is None or found.number != sleeping:
                assert time.monotonic() < deadline, found  # before it sleeps: in execve, or running
                time.sleep(0.01)
            assert not found.arguments[1] & 1  # relative
            assert found.sp and found.pc
        finally:
            child.kill()
    assert blocked_call(child.pid, child.pid) is None  # gone
