"""Android formats against upstream's test vectors (shared/reference/android-formats.md).

Upstream's vectors give pcs as malloc_debug stores them (inside the call); a
snapshot holds return addresses, so the synthetic stacks here are pc + 1.
"""

from __future__ import annotations

import struct

from leaktrace import AllocationGroup, Counters, Frame, ProcessInfo, Snapshot, SymbolizedSnapshot
from leaktrace.android.heap_dump import read_heap_dump, render_heap_dump
from leaktrace.android.leak_info import decode_leak_info, get_malloc_leak_info
from leaktrace.android.leak_log import render_leak_log
from leaktrace.model.snapshot import LiveAllocation, StackStatus

PID = 42


def ra(pc):
    """The return address malloc_debug's pc came from (it adjusts only pcs >= 4096)."""
    return pc + 1 if pc + 1 >= 4096 else pc


def group(size, pcs=(), count=1, inherited=False):
    status = StackStatus.CAPTURED if pcs else StackStatus.FILTERED
    return AllocationGroup(PID, size, count, tuple(ra(pc) for pc in pcs), status, inherited)


def snapshot(groups=(), depth=16, allocations=None, forked=False):
    """PID's snapshot; forked: PID is a forked child, whose own blocks carry the zygote bit."""
    info = ProcessInfo(PID, "app", "app", "MAP_DATA\n", forked=forked)
    return Snapshot(0.0, tuple(groups), Counters(), {PID: info}, depth, allocations)


def words(info, abi=64):
    fmt = "<Q" if abi == 64 else "<I"
    return [w for (w,) in struct.iter_unpack(fmt, info.buffer)]


def test_get_malloc_leak_info_multi():
    seventeen = tuple(range(0x1000, 0x1011))
    info = get_malloc_leak_info(
        snapshot([group(500, (0xF, 0xE, 0xD, 0xC)), group(4100, seventeen), group(9000, (0x104,))]), PID
    )
    assert info.info_size == 8 * 2 + 8 * 16 == 144
    assert info.overall_size == 3 * 144 and info.total_memory == 13600 and info.backtrace_size == 16
    w = words(info)
    assert w[0:3] == [9000, 1, 0x104] and w[3:18] == [0] * 15
    assert w[18:20] == [4100, 1] and w[20:36] == list(seventeen[:16])
    assert w[36:42] == [500, 1, 0xF, 0xE, 0xD, 0xC]


def test_backtrace_same_stack():
    stack = (0xBC000, 0xECD00, 0x12000)
    info = get_malloc_leak_info(snapshot([group(10, stack, 3), group(100, stack)], depth=4), PID)
    w = words(info)
    assert info.overall_size == 2 * info.info_size and info.total_memory == 130
    assert (w[0], w[1], w[6], w[7]) == (100, 1, 10, 3)


def test_backtrace_same_stack_mix_zygote():
    stack = (0xBC000, 0xECD00, 0x12000)
    info = get_malloc_leak_info(
        snapshot(
            [group(40, stack, 2), group(40, stack, inherited=True), group(100, stack, inherited=True)],
            depth=4,
            forked=True,
        ),
        PID,
    )
    w = words(info)
    assert [(w[i], w[i + 1]) for i in (0, 6, 12)] == [(100, 1), (40, 1), (0x80000028, 2)]
    assert info.total_memory == 220


def test_frames_missing_same_size_merge():
    info = get_malloc_leak_info(snapshot([group(100, (), 4)]), PID)
    w = words(info)
    assert info.overall_size == info.info_size and (w[0], w[1], w[2]) == (100, 4, 0)
    assert info.total_memory == 400


def test_empty_snapshot_gives_zeros():
    assert get_malloc_leak_info(snapshot([]), PID).as_tuple() == (b"", 0, 0, 0, 0)


def test_32_bit_abi_and_round_trip():
    original = [group(300, (0x100, 0x200), 2, inherited=True), group(40, (0x300,)), group(7, inherited=True)]
    for abi in (32, 64):
        info = get_malloc_leak_info(snapshot(original, depth=4, forked=True), PID, abi=abi)
        assert info.info_size == (4 if abi == 32 else 8) * 6
        decoded = decode_leak_info(info.buffer, 4, abi)
        assert [(e.zygote, e.size, e.num_allocations, e.frames) for e in decoded] == [
            (False, 300, 2, (0x100, 0x200)),
            (False, 7, 1, ()),
            (True, 40, 1, (0x300,)),
        ]


def test_sizes_above_bit_31_are_left_out_and_counted():
    info = get_malloc_leak_info(snapshot([group(1 << 31, (0x100,)), group(8, (0x100,))]), PID)
    assert info.left_out == 1 and info.total_memory == 8


def test_interleaved_pointers_stay_split_as_upstream():
    a, b = (0x10, 0x20), (0x30, 0x40)
    allocations = (
        LiveAllocation(PID, 0x1000, 24, a),
        LiveAllocation(PID, 0x2000, 24, b),
        LiveAllocation(PID, 0x3000, 24, a),
    )
    info = get_malloc_leak_info(snapshot([], allocations=allocations), PID)
    entries = decode_leak_info(info.buffer, 16)
    assert [(e.frames, e.num_allocations) for e in entries] == [((0x10, 0x20), 1), ((0x30, 0x40), 1), ((0x10, 0x20), 1)]


def dump(groups, depth, frames=None, full=False, forked=False):
    return render_heap_dump(SymbolizedSnapshot(snapshot(groups, depth, forked=forked), frames or {}), PID, "", full)


def test_heap_dump_backtrace_dump_on_signal():
    text = dump(
        [
            group(100, (0x100, 0x200)),
            group(40, (0x300, 0x400)),
            group(200, (0x500, 0x600)),
            group(10, (0xA000, 0xB000), inherited=True),
            group(50, (0xA100, 0xB200), inherited=True),
            group(5, (0xA300, 0xB300), inherited=True),
        ],
        4,
        forked=True,
    )
    assert (
        text
        == """Android Native Heap Dump v1.2

Build fingerprint: ''

Total memory: 405
Allocation records: 6
Backtrace size: 4

z 0  sz       50  num    1  bt a100 b200
z 0  sz       10  num    1  bt a000 b000
z 0  sz        5  num    1  bt a300 b300
z 1  sz      200  num    1  bt 500 600
z 1  sz      100  num    1  bt 100 200
z 1  sz       40  num    1  bt 300 400
MAPS
MAP_DATA
END
"""
    )


def test_heap_dump_shared_backtrace_and_kdumpinfo():
    text = dump([group(300, (0x100, 0x200), 2), group(400, (0xA000, 0xB000, 0xC000))], 4)
    assert (
        "Total memory: 1000\nAllocation records: 2\nBacktrace size: 4\n\n"
        "z 0  sz      400  num    1  bt a000 b000 c000\n"
        "z 0  sz      300  num    2  bt 100 200\nMAPS\n" in text
    )
    text = dump([group(1024, (0xF, 0xE, 0xD, 0xC)), group(500, (0xBC000, 0xBC001, 0xBC002)), group(100, (0x104,))], 16)
    assert (
        "Total memory: 1624\nAllocation records: 3\nBacktrace size: 16\n\n"
        "z 0  sz     1024  num    1  bt f e d c\n"
        "z 0  sz      500  num    1  bt bc000 bc001 bc002\n"
        "z 0  sz      100  num    1  bt 104\n" in text
    )


def test_heap_dump_backtrace_full():
    def frame(pc, rel_pc, function, offset, module=None):
        return (PID, ra(pc)), Frame(ra(pc), function, offset + 1 if function else 0, module, module_offset=rel_pc + 1)

    frames = dict(
        [
            frame(0x1A000, 0xA000, "func1", 0),
            frame(0x1B000, 0xB000, "func2", 0xA),
            frame(0x1C000, 0xC000, None, 0),
            frame(0x2A000, 0xA000, "level1", 0, "/data/fake.so"),
            frame(0x2B000, 0xB000, "level2", 0xA, "/data/fake.so"),
            frame(0x1100, 0x100, "fake1", 0xA),
            frame(0x1200, 0x200, "fake2", 0x14),
        ]
    )
    text = dump(
        [group(500, (0x1A000, 0x1B000, 0x1C000)), group(400, (0x2A000, 0x2B000)), group(300, (0x1100, 0x1200))],
        4,
        frames,
        full=True,
    )
    assert (
        """z 0  sz      500  num    1  bt 1a000 1b000 1c000
  bt_info {"" a000 "func1" 0} {"" b000 "func2" a} {"" c000 "" 0}
z 0  sz      400  num    1  bt 2a000 2b000
  bt_info {"/data/fake.so" a000 "level1" 0} {"/data/fake.so" b000 "level2" a}
z 0  sz      300  num    1  bt 1100 1200
  bt_info {"" 100 "fake1" a} {"" 200 "fake2" 14}
"""
        in text
    )


def leak_log(allocations, frames=None):
    snap = snapshot([], allocations=tuple(allocations))
    return render_leak_log(SymbolizedSnapshot(snap, frames or {}), PID, "malloc_testing")


def test_leak_log_backtrace_size_120():
    stack = (0x1000 + 1,)
    lines = leak_log(
        [
            LiveAllocation(PID, 0x10, 119, (), StackStatus.FILTERED),
            LiveAllocation(PID, 0x20, 120, stack),
            LiveAllocation(PID, 0x30, 121, (), StackStatus.FILTERED),
        ],
        {(PID, 0x1001): Frame(0x1001, "leaker", 0x11, "/system/lib64/libfoo.so", module_offset=0x801)},
    )
    assert lines == [
        "+++ malloc_testing leaked block of size 121 at 0x30 (leak 1 of 3)",
        "+++ malloc_testing leaked block of size 120 at 0x20 (leak 2 of 3)",
        "Backtrace at time of allocation:",
        "          #00  pc 0000000000000800  /system/lib64/libfoo.so (leaker+16)",
        "+++ malloc_testing leaked block of size 119 at 0x10 (leak 3 of 3)",
    ]


def test_leak_log_unknown_frames_and_min_max():
    lines = leak_log(
        [
            LiveAllocation(
                PID,
                0x10 * size,
                size,
                (0x5000 + 1,) if 50 <= size <= 1000 else (),
                StackStatus.CAPTURED if 50 <= size <= 1000 else StackStatus.FILTERED,
            )
            for size in (49, 50, 1000, 1001)
        ]
    )
    assert lines[0] == "+++ malloc_testing leaked block of size 1001 at 0x3e90 (leak 1 of 4)"
    assert lines[1:4] == [
        "+++ malloc_testing leaked block of size 1000 at 0x3e80 (leak 2 of 4)",
        "Backtrace at time of allocation:",
        "          #00  pc 0000000000005000  <unknown>",
    ]
    assert sum(line == "Backtrace at time of allocation:" for line in lines) == 2


def test_heap_dump_read_back_keeps_inherited_and_own_blocks_of_a_child():
    """z 0 in a forked child's dump is what it inherited, z 1 what it made; a dump with no z 1 is
    of a process that was not forked (or made nothing since)."""
    child = [group(300, (0x100,), 2, inherited=True), group(40, (0x300,))]
    read = read_heap_dump(dump(child, 4, forked=True).replace("MAP_DATA\n", ""), PID, "app", 0.0)
    assert read.processes[PID].forked
    assert sorted((g.size, g.count, g.inherited) for g in read.groups) == [(40, 1, False), (300, 2, True)]
    plain = read_heap_dump(dump([group(300, (0x100,), 2)], 4).replace("MAP_DATA\n", ""), PID, "app", 0.0)
    assert not plain.processes[PID].forked and not plain.groups[0].inherited
