"""Offsets of kernel structure members, from the running kernel's own BTF
(/sys/kernel/btf/vmlinux): the headers on this machine do not match its kernel, so a BPF
program reads such a member at an offset user space passes in, never one compiled from them."""

from __future__ import annotations

import struct
from collections.abc import Iterable

VMLINUX_BTF = "/sys/kernel/btf/vmlinux"
HEADER = struct.Struct("<HBBIIIII")  # magic, version, flags, header length, type off/len, string off/len
TYPE = struct.Struct("<III")  # name offset, info (vlen, kind, kind_flag), size or type
BTF_MAGIC = 0xEB9F
KIND_INT, KIND_ARRAY, KIND_STRUCT, KIND_UNION, KIND_ENUM = 1, 3, 4, 5, 6
KIND_FUNC_PROTO, KIND_VAR, KIND_DATASEC, KIND_DECL_TAG, KIND_ENUM64 = 13, 14, 15, 17, 19
# Bytes that follow a type's header: fixed, or per member (vlen of them).
FIXED_TAIL = {KIND_INT: 4, KIND_ARRAY: 12, KIND_VAR: 4, KIND_DECL_TAG: 4}
MEMBER_TAIL = {KIND_STRUCT: 12, KIND_UNION: 12, KIND_ENUM: 8, KIND_FUNC_PROTO: 8, KIND_DATASEC: 12, KIND_ENUM64: 12}


def _string(data: bytes, strings: int, offset: int) -> bytes:
    start = strings + offset
    return data[start : data.index(b"\0", start)]


def member_offsets(wanted: Iterable[tuple[str, str]], path: str = VMLINUX_BTF) -> dict[tuple[str, str], int]:
    """Byte offsets of (struct, member) pairs found in the kernel's BTF (the first struct of
    each name); pairs not found, or in a bitfield, are left out. {} without BTF."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        magic, _, _, header_length, type_off, type_len, str_off, _ = HEADER.unpack_from(data)
    except (OSError, struct.error):
        return {}
    if magic != BTF_MAGIC:
        return {}
    wanted = frozenset(wanted)
    structs = {name for name, _ in wanted}
    types, strings = header_length + type_off, header_length + str_off
    at, end = types, types + type_len
    found: dict[tuple[str, str], int] = {}
    while at < end and len(found) < len(wanted):
        name_off, info, _ = TYPE.unpack_from(data, at)
        kind, vlen = info >> 24 & 0x1F, info & 0xFFFF
        at += TYPE.size
        if kind == KIND_STRUCT and _string(data, strings, name_off).decode(errors="replace") in structs:
            struct_name = _string(data, strings, name_off).decode()
            for index in range(vlen):
                member_name, _, offset = TYPE.unpack_from(data, at + 12 * index)
                pair = (struct_name, _string(data, strings, member_name).decode(errors="replace"))
                bits = offset & 0xFFFFFF if info >> 31 else offset
                if pair in wanted and pair not in found and bits % 8 == 0:
                    found[pair] = bits // 8
        at += FIXED_TAIL.get(kind, 0) + MEMBER_TAIL.get(kind, 0) * vlen
    return found
