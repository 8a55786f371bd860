"""A thread's seccomp filters, read through ptrace (PTRACE_SECCOMP_GET_FILTER) and run here, as
the kernel runs them, on the system calls a caller plans to make in it: so that an attach goes
ahead only where every call it and its library will make is allowed, and never lets a filter
kill, trap or fail the process halfway. The filters are the kernel's copy, never the
process's word; a program that cannot be read or run is refused, never guessed."""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from leaktrace.platform.arch import HOST
from leaktrace.platform.ptrace import ptrace

PTRACE_SECCOMP_GET_FILTER = 0x420C
BPF_MAXINSNS = 4096  # the kernel's bound on one program's instructions
INSTRUCTION = struct.Struct("<HBBI")  # struct sock_filter: code, jt, jf, k
# seccomp's actions (the top 16 bits of a result) and their names; the kernel takes the result
# whose action, read as a signed 32-bit number, is lowest over every filter.
KILL_PROCESS, KILL_THREAD, TRAP, ERRNO = 0x80000000, 0x00000000, 0x00030000, 0x00050000
USER_NOTIF, TRACE, LOG, ALLOW = 0x7FC00000, 0x7FF00000, 0x7FFC0000, 0x7FFF0000
ACTION_NAMES = {
    KILL_PROCESS: "KILL_PROCESS",
    KILL_THREAD: "KILL_THREAD",
    TRAP: "TRAP",
    ERRNO: "ERRNO",
    USER_NOTIF: "USER_NOTIF",
    TRACE: "TRACE",
    LOG: "LOG",
    ALLOW: "ALLOW",
}
ENOSYS = 38
ANY_ERRNO = frozenset(range(1, 4096))  # a call whose failure, any failure, its code copes with


class SeccompUnreadable(Exception):
    """A filter that could not be read, or that no kernel would have run as it stands."""


@dataclass(frozen=True)
class PlannedCall:
    """A system call a caller will make: its name, arguments, and the errnos its code copes with
    (glibc falls back from clone3 on ENOSYS; a thread lives without rseq or a robust list)."""

    name: str
    args: tuple[int, ...] = ()
    copes_with: frozenset[int] = frozenset()
    fallback: PlannedCall | None = None  # made instead when this one fails with ENOSYS

    @property
    def number(self) -> int:
        return HOST.syscalls[self.name]


def read_filters(tid: int) -> list[bytes]:
    """The programs of the thread's filters, newest first; the thread must be in a ptrace stop
    of the caller's."""
    programs: list[bytes] = []
    for index in range(64):  # the kernel's bound is on total instructions (MAX_INSNS_PER_PATH 32768)
        try:
            count = ptrace(PTRACE_SECCOMP_GET_FILTER, tid, index, None)
        except OSError as e:
            if e.errno == 2:  # ENOENT: no filter at this index
                return programs
            raise SeccompUnreadable(f"its seccomp filter could not be read: {e.strerror}") from None
        if not 0 < count <= BPF_MAXINSNS:
            raise SeccompUnreadable(f"its seccomp filter has {count} instructions")
        room = (ctypes.c_uint8 * (count * INSTRUCTION.size))()
        try:
            got = ptrace(PTRACE_SECCOMP_GET_FILTER, tid, index, ctypes.addressof(room))
        except OSError as e:
            raise SeccompUnreadable(f"its seccomp filter could not be read: {e.strerror}") from None
        programs.append(bytes(room)[: min(got, count) * INSTRUCTION.size])
    raise SeccompUnreadable("it has more than 64 seccomp filters")


def _signed(value: int) -> int:
    return value - (1 << 32) if value & 0x80000000 else value


def run_filter(program: bytes, number: int, args: Sequence[int], arch: int = HOST.audit_arch, pc: int = 0) -> int:
    """The filter's 32-bit result for the call (struct seccomp_data: nr, arch, instruction
    pointer, six arguments). SeccompUnreadable for an instruction the kernel would have refused."""
    data = struct.pack("<iIQ6Q", number, arch, pc, *(list(args) + [0] * 6)[:6])
    code = [INSTRUCTION.unpack_from(program, i) for i in range(0, len(program), INSTRUCTION.size)]
    a = x = 0
    memory = [0] * 16
    pc_index = 0
    for _ in range(len(code)):  # jumps go forward only: each instruction runs once at most
        if pc_index >= len(code):
            break
        op, jt, jf, k = code[pc_index]
        pc_index += 1
        cls = op & 0x07
        if cls == 0x00:  # BPF_LD
            a = _load(op, k, data, memory)
        elif cls == 0x01:  # BPF_LDX: no ABS load into X
            x = _load(op, k, b"" if op & 0xE0 == 0x20 else data, memory)
        elif cls in (0x02, 0x03):  # BPF_ST, BPF_STX
            if k >= 16:
                raise SeccompUnreadable(f"a filter stores to slot {k}")
            memory[k] = a if cls == 0x02 else x
        elif cls == 0x04:  # BPF_ALU
            a = _alu(op, a, x if op & 0x08 else k)
        elif cls == 0x05:  # BPF_JMP
            pc_index += _jump(op, jt, jf, k, a, x)
        elif cls == 0x06:  # BPF_RET
            rval = op & 0x18
            return (a if rval == 0x10 else k) & 0xFFFFFFFF
        else:  # BPF_MISC: TAX, TXA
            if op & 0xF8 == 0x00:
                x = a
            else:
                a = x
    raise SeccompUnreadable("a filter ends without returning")


def _load(op: int, k: int, data: bytes, memory: list[int]) -> int:
    """What a load puts in A (or X): a word of seccomp_data (ABS, W), its length, k, or a slot."""
    mode, size = op & 0xE0, op & 0x18
    if mode == 0x20 and size == 0x00:  # ABS, W
        if k % 4 or k + 4 > len(data):
            raise SeccompUnreadable(f"a filter loads seccomp_data at offset {k}")
        return int(struct.unpack_from("<I", data, k)[0])
    if mode == 0x80:  # LEN
        return 64
    if mode == 0x00:  # IMM
        return k
    if mode == 0x60 and k < 16:  # MEM
        return memory[k]
    raise SeccompUnreadable(f"a filter has the load {op:#x}")


def _alu(op: int, a: int, operand: int) -> int:
    kind = op & 0xF0
    if kind in (0x30, 0x90) and operand == 0:  # DIV, MOD by zero: the kernel returns 0
        return 0
    results = {
        0x00: lambda: a + operand,
        0x10: lambda: a - operand,
        0x20: lambda: a * operand,
        0x30: lambda: a // operand,
        0x40: lambda: a | operand,
        0x50: lambda: a & operand,
        0x60: lambda: a << (operand & 31),
        0x70: lambda: a >> (operand & 31),
        0x80: lambda: -a,
        0x90: lambda: a % operand,
        0xA0: lambda: a ^ operand,
    }
    if kind not in results:
        raise SeccompUnreadable(f"a filter has the operation {op:#x}")
    return results[kind]() & 0xFFFFFFFF


def _jump(op: int, jt: int, jf: int, k: int, a: int, x: int) -> int:
    """How many instructions the jump skips."""
    kind, operand = op & 0xF0, x if op & 0x08 else k
    if kind == 0x00:  # JA
        return k
    tests = {0x10: a == operand, 0x20: a > operand, 0x30: a >= operand, 0x40: bool(a & operand)}
    if kind not in tests:
        raise SeccompUnreadable(f"a filter has the jump {op:#x}")
    return jt if tests[kind] else jf


def action_of(filters: Iterable[bytes], call: PlannedCall) -> int:
    """The result the kernel would act on for the call: the lowest action over every filter."""
    results = [run_filter(program, call.number, call.args) for program in filters]
    return min(results, key=lambda r: _signed(r & 0xFFFF0000)) if results else ALLOW


def describe(result: int) -> str:
    action = result & 0xFFFF0000
    name = ACTION_NAMES.get(action, f"{action:#x}")
    return f"{name}({result & 0xFFFF})" if action in (ERRNO, TRACE, TRAP) else name


def first_forbidden(filters: Sequence[bytes], calls: Iterable[PlannedCall]) -> str | None:
    """The first planned call the filters do not allow, with what they would do instead
    ("memfd_create: ERRNO(1)"); None when every one is allowed (or fails in a way its code copes with)."""
    for call in calls:
        result = action_of(filters, call)
        action, errno = result & 0xFFFF0000, result & 0xFFFF
        if action == ERRNO and errno == ENOSYS and call.fallback is not None:
            fallback = first_forbidden(filters, [call.fallback])
            if fallback is None:
                continue
            return f"{call.name}: {describe(result)}, and then {fallback}"
        if action == ALLOW or (action == ERRNO and errno in call.copes_with):
            continue
        return f"{call.name}: {describe(result)}"
    return None
