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
    """A thread's registers as PTRACE_GETREGS gives them: word indexes."""

    words: int
    sp: int
    pc: int
    result: int  # the system call's return value
    syscall: int  # the system call being made (-1 as unsigned when none)
    thread_pointer: int
    syscall_bytes: int  # the system call instruction's length: pc - this runs it again


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
    ported: frozenset[str]

    @property
    def eintr_wait_numbers(self) -> frozenset[int]:
        return frozenset(self.syscalls[name] for name in self.eintr_waits)


# PTRACE_GETREGS's words, x86-64's struct user_regs_struct: rax the 11th, orig_rax the 16th, rip
# the 17th, rsp the 20th, fs_base the 22nd. The one register file the attach, the holds and the
# heap walk read (aarch64 has GETREGSET only): check_machine keeps them to x86-64.
USER_REGS = PtraceRegisters(words=27, sp=19, pc=16, result=10, syscall=15, thread_pointer=21, syscall_bytes=2)

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
            "sched_yield": 24,
            "madvise": 28,
            "getpid": 39,
            "clone": 56,
            "exit": 60,
            "readlink": 89,
            "rt_sigtimedwait": 128,
            "gettid": 186,
            "futex": 202,
            "epoll_wait": 232,
            "openat": 257,
            "newfstatat": 262,
            "set_robust_list": 273,
            "epoll_pwait": 281,
            "pipe2": 293,
            "perf_event_open": 298,
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
    ported=frozenset({BPF_ENGINE, IN_PROCESS, IN_PROCESS_ATTACH, HEAP_WALK}),
)

# arm64: the BPF engine (probes at the entry, frame-pointer stacks) and the in-process engine's
# launch; not the attach and the heap walk (ptrace's registers through GETREGSET), nor the walk
# by rows (the return address in x30 or anywhere in the frame) or Python frames (tpidr_el0).
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
            "newfstatat": 79,
            "exit": 93,
            "futex": 98,
            "set_robust_list": 99,
            "sched_yield": 124,
            "rt_sigaction": 134,
            "rt_sigprocmask": 135,
            "rt_sigtimedwait": 137,
            "getpid": 172,
            "gettid": 178,
            "munmap": 215,
            "clone": 220,
            "mmap": 222,
            "mprotect": 226,
            "madvise": 233,
            "perf_event_open": 241,
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
    ported=frozenset({BPF_ENGINE, IN_PROCESS}),
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
