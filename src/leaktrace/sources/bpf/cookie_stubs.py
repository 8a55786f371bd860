"""Probe cookies on kernels without them (before Linux 5.15, perf events carry no cookie): a
program of 18 instructions for each cookie, written here in BPF machine code, stores the
cookie in the per-CPU `stub_cookie` slot and tail-calls the probe's real program, which reads
it there (probe_cookie in leaktrace.bpf.c). Each probe's perf event runs its cookie's stub."""

from __future__ import annotations

import ctypes as ct
import os
import struct

from leaktrace.platform.system import bpf

# The programs a stub may lead to: their index in the cookie_targets program array.
COOKIE_TARGETS = (b"alloc_enter", b"free_enter", b"modules_changed")

BPF_PROG_LOAD = 5
BPF_PROG_TYPE_KPROBE = 2
BPF_PSEUDO_MAP_FD = 1
HELPER_MAP_LOOKUP_ELEM = 1
HELPER_TAIL_CALL = 12
_LICENSE = ct.create_string_buffer(b"GPL")  # the tail call's targets are GPL programs


class _ProgLoadAttr(ct.Structure):
    """union bpf_attr as BPF_PROG_LOAD reads it, up to the program's name."""

    _fields_ = [
        ("prog_type", ct.c_uint32),
        ("insn_cnt", ct.c_uint32),
        ("insns", ct.c_uint64),
        ("license", ct.c_uint64),
        ("log_level", ct.c_uint32),
        ("log_size", ct.c_uint32),
        ("log_buf", ct.c_uint64),
        ("kern_version", ct.c_uint32),
        ("prog_flags", ct.c_uint32),
        ("prog_name", ct.c_char * 16),
    ]


def _insn(opcode: int, dst: int = 0, src: int = 0, offset: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", opcode, src << 4 | dst, offset, imm)


def _load_imm64(dst: int, value: int, src: int = 0) -> bytes:
    """Two instructions: dst = value (src BPF_PSEUDO_MAP_FD: value is a map's fd)."""
    return _insn(0x18, dst, src, imm=ct.c_int32(value & 0xFFFFFFFF).value) + _insn(
        0, imm=ct.c_int32(value >> 32 & 0xFFFFFFFF).value
    )


def stub_code(cookie: int, cookie_map_fd: int, targets_map_fd: int, target: int) -> bytes:
    """The stub: stub_cookie[0] = cookie, then a tail call to cookie_targets[target] with the
    probe's context (r1); it returns 0 only if that call fails."""
    mov_reg, mov_imm, add_imm, store_word, store_dword = 0xBF, 0xB7, 0x07, 0x62, 0x7B
    call, jump_if_zero, exit_ = 0x85, 0x15, 0x95
    code = [
        _insn(mov_reg, 6, 1),  # r6 = ctx
        _insn(store_word, 10, offset=-4, imm=0),  # the key, 0, on the stack
        _insn(mov_reg, 2, 10),
        _insn(add_imm, 2, imm=-4),  # r2 = &key
        _load_imm64(1, cookie_map_fd, BPF_PSEUDO_MAP_FD),
        _insn(call, imm=HELPER_MAP_LOOKUP_ELEM),
        _insn(jump_if_zero, 0, offset=8),  # no slot: to the end
        _load_imm64(1, cookie),
        _insn(store_dword, 0, 1),  # *slot = cookie
        _insn(mov_reg, 1, 6),
        _load_imm64(2, targets_map_fd, BPF_PSEUDO_MAP_FD),
        _insn(mov_imm, 3, imm=target),
        _insn(call, imm=HELPER_TAIL_CALL),
        _insn(mov_imm, 0, imm=0),
        _insn(exit_),
    ]
    return b"".join(code)


class CookieStubs:
    """One stub program per (target, cookie), loaded at first use; close() frees them (a perf
    event keeps the program it runs)."""

    def __init__(self, cookie_map_fd: int, targets_map_fd: int):
        self._maps = cookie_map_fd, targets_map_fd
        self._loaded: dict[tuple[bytes, int], int] = {}

    def program(self, target: bytes, cookie: int) -> int:
        """The fd of the stub that gives `cookie` to program `target`."""
        key = (target, cookie)
        if key not in self._loaded:
            code = stub_code(cookie, *self._maps, COOKIE_TARGETS.index(target))
            buffer = ct.create_string_buffer(code, len(code))
            attr = _ProgLoadAttr(
                prog_type=BPF_PROG_TYPE_KPROBE,
                insn_cnt=len(code) // 8,
                insns=ct.addressof(buffer),
                license=ct.addressof(_LICENSE),
                prog_name=b"cookie_stub",
            )
            self._loaded[key] = bpf(BPF_PROG_LOAD, attr)
        return self._loaded[key]

    def close(self) -> None:
        for fd in self._loaded.values():
            os.close(fd)
        self._loaded.clear()
