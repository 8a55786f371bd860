"""The cookie stub's machine code (sources/bpf/cookie_stubs.py), decoded: the cookie stored
whole, the tail call to its target with the probe's context, a failed lookup or tail call
ending at `return 0`. Loading and running it is the kernel's: the BPF tests with
LEAKTRACE_FEATURES_OFF=perf_link_cookie and the 5.10 test VM."""

from __future__ import annotations

import struct

from leaktrace.sources.bpf.cookie_stubs import COOKIE_TARGETS, HELPER_MAP_LOOKUP_ELEM, HELPER_TAIL_CALL, stub_code


def decode(code: bytes) -> list[tuple[int, int, int, int, int]]:
    """(opcode, dst, src, offset, imm) of each 8-byte slot."""
    slots = []
    for at in range(0, len(code), 8):
        opcode, registers, offset, imm = struct.unpack_from("<BBhi", code, at)
        slots.append((opcode, registers & 0xF, registers >> 4, offset, imm))
    return slots


def wide_value(slots, at: int) -> int:
    return (slots[at][4] & 0xFFFFFFFF) | (slots[at + 1][4] & 0xFFFFFFFF) << 32


def test_the_stub_stores_its_whole_cookie_and_tail_calls_its_target():
    cookie = 0xFEDC_BA98_7654_3210
    slots = decode(stub_code(cookie, cookie_map_fd=7, targets_map_fd=9, target=COOKIE_TARGETS.index(b"free_enter")))
    assert len(slots) == 18
    wide = [at for at, slot in enumerate(slots) if slot[0] == 0x18]
    assert [(slots[at][2], wide_value(slots, at)) for at in wide] == [(1, 7), (0, cookie), (1, 9)]
    calls = [slot[4] for slot in slots if slot[0] == 0x85]
    assert calls == [HELPER_MAP_LOOKUP_ELEM, HELPER_TAIL_CALL]
    tail_call = next(at for at, slot in enumerate(slots) if slot[0] == 0x85 and slot[4] == HELPER_TAIL_CALL)
    assert slots[tail_call - 1][:2] == (0xB7, 3) and slots[tail_call - 1][4] == 1  # r3 = the target's index
    assert slots[tail_call - 4][:3] == (0xBF, 1, 6)  # r1 = the context saved in r6
    assert slots[0][:3] == (0xBF, 6, 1)
    assert slots[-2][:2] == (0xB7, 0) and slots[-2][4] == 0 and slots[-1][0] == 0x95


def test_a_missing_slot_jumps_to_return_zero():
    slots = decode(stub_code(1, 3, 4, 0))
    jump = next(at for at, slot in enumerate(slots) if slot[0] == 0x15)
    assert slots[jump][1] == 0  # if r0 == 0
    assert jump + 1 + slots[jump][3] == len(slots) - 2
