"""Struct member offsets read from BTF: a blob built here, and the running kernel's own."""

from __future__ import annotations

import struct

from each import each

from leaktrace.platform.kernel_types import BTF_MAGIC, HEADER, KIND_INT, KIND_STRUCT, TYPE, member_offsets


def btf_blob() -> bytes:
    """int; struct task_struct {int a; int signal;}; struct signal_struct {int tty;}, the last
    with kind_flag set (member offsets then carry a bitfield size in their top byte)."""
    names = b"\0int\0task_struct\0a\0signal\0signal_struct\0tty\0"

    def at(name: bytes) -> int:
        return names.index(b"\0" + name + b"\0") + 1

    types = TYPE.pack(at(b"int"), KIND_INT << 24, 4) + struct.pack("<I", 32)
    types += TYPE.pack(at(b"task_struct"), KIND_STRUCT << 24 | 2, 16)
    types += TYPE.pack(at(b"a"), 1, 0) + TYPE.pack(at(b"signal"), 1, 64)
    types += TYPE.pack(at(b"signal_struct"), 1 << 31 | KIND_STRUCT << 24 | 1, 24)
    types += TYPE.pack(at(b"tty"), 1, 0 << 24 | 128)
    header = HEADER.pack(BTF_MAGIC, 1, 0, HEADER.size, 0, len(types), len(types), len(names))
    return header + types + names


def test_member_offsets_of_a_built_blob(tmp_path):
    path = tmp_path / "btf"
    path.write_bytes(btf_blob())
    wanted = [("task_struct", "signal"), ("signal_struct", "tty"), ("signal_struct", "missing")]
    assert member_offsets(wanted, str(path)) == {("task_struct", "signal"): 8, ("signal_struct", "tty"): 16}


def test_no_btf_gives_no_offsets(tmp_path):
    (tmp_path / "short").write_bytes(b"\x9f\xeb")
    assert member_offsets([("task_struct", "signal")], str(tmp_path / "short")) == {}
    assert member_offsets([("task_struct", "signal")], str(tmp_path / "absent")) == {}


def test_the_running_kernel_has_both_members_the_holds_read():
    found = member_offsets([("task_struct", "signal"), ("signal_struct", "tty")])
    assert set(found) == {("task_struct", "signal"), ("signal_struct", "tty")}
    assert all(0 < offset < 1 << 16 for offset in each(found.values()))
