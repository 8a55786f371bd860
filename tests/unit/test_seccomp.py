"""The seccomp filter interpreter (platform/seccomp.py) on hand-assembled classic BPF: loads of
seccomp_data, the ALU, jumps, scratch memory, the precedence of actions across filters, the
fallback from clone3, and the programs no kernel would run."""

from __future__ import annotations

import struct

import pytest

from leaktrace.platform.seccomp import (
    ALLOW,
    ENOSYS,
    ERRNO,
    KILL_PROCESS,
    KILL_THREAD,
    LOG,
    TRAP,
    PlannedCall,
    SeccompUnreadable,
    action_of,
    first_forbidden,
    run_filter,
)

LD_ABS, LD_IMM, LD_MEM, LDX_IMM, ST, STX = 0x20, 0x00, 0x60, 0x01, 0x02, 0x03
ALU_ADD_K, ALU_AND_K, ALU_LSH_K, ALU_DIV_K, ALU_ADD_X, ALU_NEG = 0x04, 0x54, 0x64, 0x34, 0x0C, 0x84
JA, JEQ_K, JGT_K, JGE_K, JSET_K, JEQ_X = 0x05, 0x15, 0x25, 0x35, 0x45, 0x1D
RET_K, RET_A, TAX, TXA = 0x06, 0x16, 0x07, 0x87
NR, ARCH, ARG0_LOW, ARG0_HIGH, ARG3_LOW = 0, 4, 16, 20, 40


def program(*instructions: tuple[int, int, int, int]) -> bytes:
    return b"".join(struct.pack("<HBBI", *instruction) for instruction in instructions)


def deny(number: int, action: int) -> bytes:
    """action for one system call, ALLOW for the rest."""
    return program((LD_ABS, 0, 0, NR), (JEQ_K, 0, 1, number), (RET_K, 0, 0, action), (RET_K, 0, 0, ALLOW))


def test_a_call_and_its_arguments_as_the_kernel_lays_them_out():
    # mmap(..., flags & MAP_NORESERVE) -> ERRNO(12); the 64-bit argument's halves read apart.
    flags = program(
        (LD_ABS, 0, 0, NR),
        (JEQ_K, 0, 3, 9),
        (LD_ABS, 0, 0, ARG3_LOW),
        (JSET_K, 0, 1, 0x4000),
        (RET_K, 0, 0, ERRNO | 12),
        (RET_K, 0, 0, ALLOW),
    )
    assert run_filter(flags, 9, (0, 1, 3, 0x4022)) == ERRNO | 12
    assert run_filter(flags, 9, (0, 1, 3, 0x22)) == ALLOW
    high = program((LD_ABS, 0, 0, ARG0_HIGH), (JEQ_K, 0, 1, 0x7F00), (RET_K, 0, 0, TRAP), (RET_K, 0, 0, ALLOW))
    assert run_filter(high, 0, (0x7F0000001000,)) == TRAP
    arch = program((LD_ABS, 0, 0, ARCH), (JEQ_K, 1, 0, 0xC000003E), (RET_K, 0, 0, KILL_PROCESS), (RET_A, 0, 0, 0))
    assert run_filter(arch, 0, ()) == 0xC000003E  # RET A: the accumulator itself


def test_arithmetic_memory_and_register_moves():
    code = program(
        (LD_IMM, 0, 0, 6),
        (ALU_ADD_K, 0, 0, 4),  # 10
        (ALU_LSH_K, 0, 0, 2),  # 40
        (ST, 0, 0, 3),
        (LDX_IMM, 0, 0, 2),
        (ALU_ADD_X, 0, 0, 0),  # 42
        (TAX, 0, 0, 0),
        (LD_MEM, 0, 0, 3),  # 40
        (ALU_DIV_K, 0, 0, 0),  # division by zero: 0, as the kernel
        (ALU_NEG, 0, 0, 0),
        (STX, 0, 0, 5),
        (TXA, 0, 0, 0),
        (JEQ_X, 1, 0, 0),  # A == X (42): skip one
        (RET_K, 0, 0, KILL_THREAD),
        (JGT_K, 0, 2, 41),
        (JGE_K, 0, 1, 43),
        (RET_K, 0, 0, LOG),
        (RET_A, 0, 0, 0),
    )
    assert run_filter(code, 0, ()) == 42


def test_the_strictest_action_of_every_filter_wins():
    call = PlannedCall("memfd_create")
    assert action_of([deny(319, ERRNO | 1), deny(319, LOG)], call) == ERRNO | 1
    assert action_of([deny(319, ERRNO | 1), deny(319, KILL_PROCESS)], call) == KILL_PROCESS
    assert action_of([deny(319, KILL_THREAD), deny(319, TRAP)], call) == KILL_THREAD
    assert action_of([], call) == ALLOW


def test_the_first_forbidden_call_is_named_with_its_action():
    calls = [PlannedCall("mmap"), PlannedCall("memfd_create"), PlannedCall("pipe2")]
    assert first_forbidden([deny(319, ERRNO | 1)], calls) == "memfd_create: ERRNO(1)"
    assert first_forbidden([deny(293, KILL_PROCESS)], calls) == "pipe2: KILL_PROCESS"
    assert first_forbidden([deny(1, KILL_PROCESS)], calls) is None


def test_clone3_unknown_to_a_filter_falls_back_to_clone():
    clone3 = PlannedCall("clone3", fallback=PlannedCall("clone"))
    assert first_forbidden([deny(435, ERRNO | ENOSYS)], [clone3]) is None
    assert first_forbidden([deny(435, ERRNO | 1)], [clone3]) == "clone3: ERRNO(1)"
    both = [deny(435, ERRNO | ENOSYS), deny(56, KILL_PROCESS)]
    assert first_forbidden(both, [clone3]) == "clone3: ERRNO(38), and then clone: KILL_PROCESS"
    rseq = PlannedCall("rseq", copes_with=frozenset({1}))
    assert first_forbidden([deny(334, ERRNO | 1)], [rseq]) is None


@pytest.mark.parametrize(
    "code",
    [
        program((LD_ABS, 0, 0, 2), (RET_A, 0, 0, 0)),  # a load not on a word
        program((LD_ABS, 0, 0, 64), (RET_A, 0, 0, 0)),  # past seccomp_data
        program((ST, 0, 0, 16), (RET_A, 0, 0, 0)),  # no such scratch slot
        program((LD_IMM, 0, 0, 1)),  # no return
        program((0x28, 0, 0, 0), (RET_A, 0, 0, 0)),  # a half-word load
    ],
)
def test_a_program_no_kernel_would_run_is_refused(code):
    with pytest.raises(SeccompUnreadable):
        run_filter(code, 0, ())
