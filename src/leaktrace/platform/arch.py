"""Every fact of x86-64 (Linux, System V ABI) that leaktrace relies on, in one place."""

import os

from leaktrace.errors import RuntimeFailure

MACHINE = "x86_64"  # the machine these facts are of, as uname names it

NAME = "x86_64"  # as libmemunreachable's report names the ABI
SYS_BPF = 321  # the bpf() system call's number
SYS_READ, SYS_RT_SIGACTION = 0, 13
AUDIT_ARCH = 0xC000003E  # AUDIT_ARCH_X86_64: what a seccomp filter sees as the call's architecture
# The system calls whose seccomp verdict an attach asks for (platform/seccomp.py), by name.
SYSCALL_NUMBERS = {
    "read": 0,
    "write": 1,
    "close": 3,
    "poll": 7,
    "mmap": 9,
    "mprotect": 10,
    "munmap": 11,
    "rt_sigaction": 13,
    "rt_sigprocmask": 14,
    "sched_yield": 24,
    "madvise": 28,
    "getpid": 39,
    "clone": 56,
    "exit": 60,
    "readlink": 89,
    "gettid": 186,
    "futex": 202,
    "set_robust_list": 273,
    "openat": 257,
    "newfstatat": 262,
    "pipe2": 293,
    "memfd_create": 319,
    "rseq": 334,
    "perf_event_open": 298,
    "clone3": 435,
}
# struct user_regs_struct (PTRACE_GETREGS): 27 words; rsp is the 20th, fs_base (the thread pointer) the 22nd.
USER_REGS_WORDS, RSP_INDEX, FS_BASE_INDEX = 27, 19, 21
RAX_INDEX, ORIG_RAX_INDEX, RIP_INDEX = 10, 15, 16
SYSCALL_BYTES = 2  # the syscall instruction: rip - 2 runs it again
# Waits the kernel ends with EINTR, never restarting them, when a ptrace interrupt wakes them:
# rt_sigtimedwait, epoll_wait, epoll_pwait, epoll_pwait2.
EINTR_WAITS = frozenset({128, 232, 281, 441})
RED_ZONE = 128  # bytes below the stack pointer that are still the running function's
SIZE_MAX = 2**64 - 1  # size_t's largest value
# The allocator's arguments, in order: rdi, rsi, rdx (the probes read them from the registers).
ARGUMENT_REGISTERS = ("rdi", "rsi", "rdx")


def check_machine() -> None:
    """Refuses, in one line, to trace on a machine whose facts are not these (before a system
    call number or a register of x86-64 is used on it)."""
    machine = os.uname().machine
    if machine != MACHINE:
        raise RuntimeFailure(
            f"this machine is {machine}: leaktrace traces on {MACHINE} only (its system calls, registers and frames)"
        )
