"""Every fact of a machine's architecture (Linux, its C ABI) that leaktrace relies on, one table
per architecture. Python reads HOST, the running machine's table; the preload library, the CFI
interpreter and the BPF programs read the same facts from arch.h, which c_header() writes
from these tables (tests/unit/test_layouts.py fails when it is stale; regenerate with
`python -m leaktrace.platform.arch`). Adding an architecture is a table here; the parts it
runs are named in its `ported`, and check_machine refuses the rest in one line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from types import MappingProxyType

from leaktrace.errors import RuntimeFailure

# The parts of leaktrace that run on an architecture once ported to it.
BPF_ENGINE, IN_PROCESS, HEAP_WALK = "the BPF engine", "the in-process engine", "the heap walk"
IN_PROCESS_ATTACH = "the in-process attach"  # -p: ptrace's remote calls and register sets


@dataclass(frozen=True)
class PtraceRegisters:
    """A thread's general registers as ptrace reads them (x86-64: PTRACE_GETREGS's struct
    user_regs_struct; aarch64: GETREGSET NT_PRSTATUS's struct user_pt_regs): word indexes."""

    words: int
    by_regset: bool  # read and written through GETREGSET NT_PRSTATUS (aarch64 has no GETREGS)
    sp: int
    pc: int
    result: int  # a call's return value (a system call's too)
    arguments: tuple[int, ...]  # a C call's integer arguments, in order
    number: int  # where a system call's number is passed
    # The word naming the system call a stopped thread is in (-1 as unsigned when none); None
    # where the kernel forgets it before a ptrace stop (aarch64): /proc/TID/syscall tells then.
    syscall: int | None
    link: int | None  # the register a call leaves its return address in; None: pushed at [sp]
    flags: int  # the flags word, and the bits of it a call must start with clear
    flags_cleared_for_call: int
    thread_pointer: int | None  # None: not among these words (aarch64's tpidr_el0)
    syscall_bytes: int  # the system call instruction's length: pc - this runs it again
    # What a call keeps (the callee-saved registers, the first argument, the stack and thread pointers).
    kept_by_call: frozenset[int]
    vector_regsets: tuple[int, ...]  # the GETREGSET notes holding what a call may change beyond these words


@dataclass(frozen=True)
class Arch:
    machine: str  # as uname names it
    abi: str  # as libmemunreachable's report names it
    audit_arch: int  # what a seccomp filter sees as a call's architecture (AUDIT_ARCH_*)
    syscalls: Mapping[str, int]  # the system calls leaktrace makes or plans for, by the kernel's name
    # Waits the kernel ends with EINTR, never restarting them, when a ptrace interrupt wakes them.
    eintr_waits: tuple[str, ...]
    red_zone: int  # bytes below the stack pointer that are still the running function's
    size_max: int  # size_t's largest value
    argument_registers: tuple[str, ...]  # the first three arguments' registers, as pt_regs names them
    # Bytes from a return address back into its call instruction, as bionic's backtrace moves it.
    call_site_back: int
    user_address_bits: int  # a user-space address is below 2**this
    return_pops_address: int  # bytes the stack pointer moves at a return (the return address popped)
    dwarf_sp: int  # DWARF register numbers: the stack pointer, the frame pointer, the return address
    dwarf_fp: int
    dwarf_ra: int
    jump_slot: int  # relocation types of a PLT slot and of a GOT entry
    glob_dat: int
    spin_hint: str  # the instruction a spinning thread runs between looks
    # Whether rows.h's rows describe its frames (the return address at CFA-8, the frame pointer
    # saved or kept): where not, the library's walk is libgcc's and the BPF walk is not ported.
    rows_walk: bool
    # Whether probe placement reads its instructions (sources/bpf/probe_placement.py): a probe
    # may then sit past the entry, its arguments moved to other registers; else it stays at the entry.
    moves_probes: bool
    single_step_us: int | None  # what a call through a probe stepped out of line costs, where measured
    registers: PtraceRegisters
    waiting_calls: tuple[str, ...]  # system calls a thread blocks in without holding a lock
    ported: frozenset[str]

    @property
    def eintr_wait_numbers(self) -> frozenset[int]:
        return frozenset(self.syscalls[name] for name in self.eintr_waits)

    @property
    def waiting_call_numbers(self) -> frozenset[int]:
        return frozenset(self.syscalls[name] for name in self.waiting_calls)


X86_64 = Arch(
    machine="x86_64",
    abi="x86_64",
    audit_arch=0xC000003E,
    syscalls=MappingProxyType(
        {
            "read": 0,
            "write": 1,
            "close": 3,
            "poll": 7,
            "mmap": 9,
            "mprotect": 10,
            "munmap": 11,
            "rt_sigaction": 13,
            "rt_sigprocmask": 14,
            "select": 23,
            "sched_yield": 24,
            "madvise": 28,
            "pause": 34,
            "nanosleep": 35,
            "getpid": 39,
            "accept": 43,
            "recvfrom": 45,
            "recvmsg": 47,
            "clone": 56,
            "exit": 60,
            "wait4": 61,
            "readlink": 89,
            "rt_sigtimedwait": 128,
            "rt_sigsuspend": 130,
            "gettid": 186,
            "futex": 202,
            "restart_syscall": 219,
            "clock_nanosleep": 230,
            "epoll_wait": 232,
            "openat": 257,
            "newfstatat": 262,
            "pselect6": 270,
            "ppoll": 271,
            "set_robust_list": 273,
            "epoll_pwait": 281,
            "accept4": 288,
            "pipe2": 293,
            "perf_event_open": 298,
            "recvmmsg": 299,
            "memfd_create": 319,
            "bpf": 321,
            "rseq": 334,
            "clone3": 435,
            "epoll_pwait2": 441,
        }
    ),
    eintr_waits=("rt_sigtimedwait", "epoll_wait", "epoll_pwait", "epoll_pwait2"),
    red_zone=128,
    size_max=2**64 - 1,
    argument_registers=("rdi", "rsi", "rdx"),
    call_site_back=1,
    user_address_bits=47,
    return_pops_address=8,
    dwarf_sp=7,
    dwarf_fp=6,
    dwarf_ra=16,
    jump_slot=7,  # R_X86_64_JUMP_SLOT
    glob_dat=6,  # R_X86_64_GLOB_DAT
    spin_hint="pause",
    rows_walk=True,
    moves_probes=True,
    single_step_us=15,
    # struct user_regs_struct: r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax
    # rip cs eflags rsp ss fs_base gs_base ds es fs gs. A call starts with the direction flag clear.
    registers=PtraceRegisters(
        words=27,
        by_regset=False,
        sp=19,
        pc=16,
        result=10,
        arguments=(14, 13, 12, 11, 9, 8),
        number=10,
        syscall=15,
        link=None,
        flags=18,
        flags_cleared_for_call=0x400,
        thread_pointer=21,
        syscall_bytes=2,
        kept_by_call=frozenset({0, 1, 2, 3, 4, 5, 14, 19, 21, 22}),
        vector_regsets=(0x202,),  # NT_X86_XSTATE
    ),
    waiting_calls=(
        "read",
        "poll",
        "select",
        "pause",
        "nanosleep",
        "accept",
        "recvfrom",
        "recvmsg",
        "wait4",
        "rt_sigtimedwait",
        "rt_sigsuspend",
        "futex",
        "clock_nanosleep",
        "epoll_wait",
        "pselect6",
        "ppoll",
        "epoll_pwait",
        "accept4",
        "recvmmsg",
        "epoll_pwait2",
    ),
    ported=frozenset({BPF_ENGINE, IN_PROCESS, IN_PROCESS_ATTACH, HEAP_WALK}),
)

# arm64: the BPF engine (probes at the entry, frame-pointer stacks) and the in-process engine,
# launched and attached; not the heap walk (glibc's TLS through tpidr_el0), nor the walk by rows
# (the return address in x30 or anywhere in the frame) or Python frames (tpidr_el0).
AARCH64 = Arch(
    machine="aarch64",
    abi="arm64",
    audit_arch=0xC00000B7,
    syscalls=MappingProxyType(
        {
            "epoll_pwait": 22,
            "openat": 56,
            "close": 57,
            "pipe2": 59,
            "read": 63,
            "write": 64,
            "pselect6": 72,
            "ppoll": 73,
            "readlinkat": 78,
            "newfstatat": 79,
            "exit": 93,
            "futex": 98,
            "set_robust_list": 99,
            "nanosleep": 101,
            "clock_nanosleep": 115,
            "sched_yield": 124,
            "restart_syscall": 128,
            "rt_sigsuspend": 133,
            "rt_sigaction": 134,
            "rt_sigprocmask": 135,
            "rt_sigtimedwait": 137,
            "getpid": 172,
            "gettid": 178,
            "accept": 202,
            "recvfrom": 207,
            "recvmsg": 212,
            "munmap": 215,
            "clone": 220,
            "mmap": 222,
            "mprotect": 226,
            "madvise": 233,
            "perf_event_open": 241,
            "accept4": 242,
            "recvmmsg": 243,
            "wait4": 260,
            "memfd_create": 279,
            "bpf": 280,
            "rseq": 293,
            "clone3": 435,
            "epoll_pwait2": 441,
        }
    ),
    eintr_waits=("rt_sigtimedwait", "epoll_pwait", "epoll_pwait2"),
    red_zone=0,
    size_max=2**64 - 1,
    argument_registers=("regs[0]", "regs[1]", "regs[2]"),
    call_site_back=4,
    user_address_bits=48,
    return_pops_address=0,
    dwarf_sp=31,
    dwarf_fp=29,
    dwarf_ra=30,
    jump_slot=1026,  # R_AARCH64_JUMP_SLOT
    glob_dat=1025,  # R_AARCH64_GLOB_DAT
    spin_hint="yield",
    rows_walk=False,  # the return address is in x30, or saved anywhere in the frame
    moves_probes=False,
    single_step_us=None,  # measured only under TCG, which says nothing of hardware
    # struct user_pt_regs: x0..x30 (x30 the link register), sp, pc, pstate. A call starts with
    # pstate's BTYPE clear, as after no branch.
    registers=PtraceRegisters(
        words=34,
        by_regset=True,
        sp=31,
        pc=32,
        result=0,
        arguments=(0, 1, 2, 3, 4, 5),
        number=8,
        syscall=None,
        link=30,
        flags=33,
        flags_cleared_for_call=0xC00,
        thread_pointer=None,
        syscall_bytes=4,
        kept_by_call=frozenset({0, *range(19, 30), 31}),
        vector_regsets=(2, 0x405),  # NT_PRFPREG, NT_ARM_SVE (where the CPU has it)
    ),
    waiting_calls=(
        "read",
        "nanosleep",
        "accept",
        "recvfrom",
        "recvmsg",
        "wait4",
        "rt_sigtimedwait",
        "rt_sigsuspend",
        "futex",
        "clock_nanosleep",
        "pselect6",
        "ppoll",
        "epoll_pwait",
        "accept4",
        "recvmmsg",
        "epoll_pwait2",
    ),
    ported=frozenset({BPF_ENGINE, IN_PROCESS, IN_PROCESS_ATTACH}),
)

TABLES = {table.machine: table for table in (X86_64, AARCH64)}
# This machine's table; on a machine with none, x86-64's stands in for it, and check_machine
# refuses every part before a fact of it is used.
HOST = TABLES.get(os.uname().machine, X86_64)
HEADER = Path(__file__).with_name("arch.h")


def check_machine(part: str) -> None:
    """Refuses, in one line, to run a part of leaktrace on a machine it is not ported to (before
    a system call number, a register or a frame rule of another machine is used on it)."""
    machine = os.uname().machine
    table = TABLES.get(machine)
    if table is None:
        known = ", ".join(TABLES)
        raise RuntimeFailure(
            f"this machine is {machine}: leaktrace knows {known} only (its system calls, registers and frames)"
        )
    if part not in table.ported:
        where = ", ".join(t.machine for t in TABLES.values() if part in t.ported)
        raise RuntimeFailure(f"this machine is {machine}: {part} runs on {where} only (docs/limits.md)")


def built_here(directory: Path, stem: str) -> str | None:
    """The module pip built in directory for this interpreter's machine: its suffix names the
    machine, so another machine's build beside it (an arm64 VM's, same checkout) is never taken."""
    for suffix in EXTENSION_SUFFIXES:
        path = directory / f"{stem}{suffix}"
        if path.is_file():
            return str(path)
    return None


def _section(table: Arch, directive: str) -> list[str]:
    facts = {
        "CALL_SITE_BACK": table.call_site_back,
        "USER_ADDRESS_BITS": table.user_address_bits,
        "RETURN_POPS_ADDRESS": table.return_pops_address,
        "DWARF_SP": table.dwarf_sp,
        "DWARF_FP": table.dwarf_fp,
        "DWARF_RA": table.dwarf_ra,
        "JUMP_SLOT": table.jump_slot,
        "GLOB_DAT": table.glob_dat,
        "ROWS_WALK": int(table.rows_walk),
        "MOVES_PROBES": int(table.moves_probes),
    }
    guard = f"defined(__{table.machine}__) || defined(LEAKTRACE_ARCH_{table.machine})"
    return [
        f"{directive} {guard}",
        *(f"#define ARCH_{name} {value}" for name, value in facts.items()),
        f'#define ARCH_SPIN_HINT() __asm__ volatile("{table.spin_hint}")',
    ]


def c_header() -> str:
    """arch.h: the table of the machine a C file is built for (its compiler's __x86_64__ or
    __aarch64__; a BPF program, built for no machine, is told LEAKTRACE_ARCH_<machine>)."""
    lines = [
        "// Generated from platform/arch.py (python -m leaktrace.platform.arch); tests/unit/test_layouts.py checks it.",
        "#ifndef LEAKTRACE_ARCH_H",
        "#define LEAKTRACE_ARCH_H",
        "",
    ]
    for index, table in enumerate(TABLES.values()):
        lines += _section(table, "#if" if index == 0 else "#elif")
    lines += ["#else", '#error "no architecture table in platform/arch.py for this machine"', "#endif", "", "#endif"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    HEADER.write_text(c_header())
