"""Every reporter's output, whole, against golden files (tests/unit/golden/): the text
report, the systemwide process report, libmemunreachable's report, the heap summary, the
JSON report (indented), the folded stacks and the pprof profile (its protobuf as text), each
from a synthetic snapshot. LEAKTRACE_UPDATE_GOLDEN=1 rewrites the files (review the diff)."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from leaktrace import AllocationGroup, Counters, Frame, ProcessInfo, Snapshot, StackStatus, SymbolizedSnapshot
from leaktrace.analysis.growth import GrowthTracker
from leaktrace.android.unreachable_report import render_unreachable
from leaktrace.model.heap import ArenaUse, HeapReport, HeapWalk
from leaktrace.model.snapshot import UnreachableLeak, UnreachableReport
from leaktrace.outputs.folded import render_folded
from leaktrace.outputs.heap_summary import render_heap_text
from leaktrace.outputs.json_report import render_json
from leaktrace.outputs.pprof import profile_class, render_pprof
from leaktrace.outputs.process_report import render_process_report
from leaktrace.outputs.text import render_text

GOLDEN = Path(__file__).parent / "golden"
FRAMES = {
    (10, 0x1010): Frame(0x1010, "make_node", 0x10, "/opt/app/bin/server", "node.c", 42),
    (10, 0x2020): Frame(0x2020, "main", 0x20, "/opt/app/bin/server", "main.c", 7),
    (10, 0x3030): Frame(0x3030, None, 0x3030, "/usr/lib/libc.so.6"),
    (20, 0x4040): Frame(0x4040, "worker_loop", 0x8, "/opt/app/worker"),
}
PROCESSES = {10: ProcessInfo(10, "server"), 20: ProcessInfo(20, "worker")}
STACK = (0x1010, 0x2020, 0x3030)


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    """Reports print the local time of their snapshot: the same everywhere in UTC."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def matches_golden(name: str, text: str) -> bool:
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("LEAKTRACE_UPDATE_GOLDEN"):
        path.write_text(text)
    return path.read_text() == text


def snapshot(at: float, groups: list[AllocationGroup]) -> SymbolizedSnapshot:
    counters = Counters(allocations=120, frees=40, unknown_frees=2, stacks_truncated=1)
    return SymbolizedSnapshot(Snapshot(1_700_000_000.0 + at, tuple(groups), counters, PROCESSES), FRAMES)


def test_text_report():
    groups = [
        AllocationGroup(10, 24, 3, STACK),
        AllocationGroup(10, 4096, 2, STACK),
        AllocationGroup(10, 64, 5, STACK, inherited=True),
        AllocationGroup(10, 10000, 1, (), StackStatus.FILTERED),
        AllocationGroup(10, 16, 4, (), StackStatus.LOST),
    ]
    assert matches_golden("text_report", render_text(snapshot(0, groups)))


def reported_groups() -> list[AllocationGroup]:
    return [
        AllocationGroup(10, 24, 3, STACK),
        AllocationGroup(10, 4096, 2, STACK),
        AllocationGroup(10, 64, 5, STACK, inherited=True),
        AllocationGroup(10, 10000, 1, (), StackStatus.FILTERED),
        AllocationGroup(20, 16, 4, (0x4040,)),
    ]


def test_json_report():
    text = json.dumps(json.loads(render_json(snapshot(0, reported_groups()))), indent=1, sort_keys=True) + "\n"
    assert matches_golden("json_report", text)


def test_folded_stacks():
    assert matches_golden("folded_stacks", render_folded(snapshot(0, reported_groups())))


def test_pprof_profile():
    from google.protobuf import text_format

    profile = profile_class().FromString(gzip.decompress(render_pprof(snapshot(0, reported_groups()), 5.0)))
    assert matches_golden("pprof_profile", text_format.MessageToString(profile))


def test_process_report():
    tracker = GrowthTracker(intervals=2)
    for at in range(3):
        groups = [AllocationGroup(10, 64, 10 * (at + 1), STACK), AllocationGroup(20, 4096, 1, (0x4040,))]
        growth = tracker.observe(snapshot(at, groups).snapshot)
    text = render_process_report(snapshot(2, groups), growth, top_processes=5, top_stacks=2)
    assert matches_golden("process_report", text)


def test_unreachable_report():
    leaks = (
        UnreachableLeak(
            10, 0x55D0C63A02A0, 48, 3, 144, STACK, contents=bytes(range(48)), similar_count=2, similar_size=96
        ),
        UnreachableLeak(10, 0x55D0C63A1000, 40, 0, 0, (), StackStatus.BEFORE_TRACE, contents=b"leaked\0" * 5),
    )
    report = UnreachableReport(
        10,
        leaks,
        2,
        7,
        328,
        120,
        9000,
        True,
        0.0012,
        0.0087,
        0,
        heap_walk="heap walk (glibc 2.36): 120 blocks in use in 1 arena and 0 mmapped "
        "chunks, walked in 1.0 ms; main_arena from libc's symbols",
        before_trace=30,
    )
    text = render_unreachable(snapshot(0, []), report, contents=True)
    assert matches_golden("unreachable_report", text)


def test_heap_summary():
    addresses = np.array([0x1010, 0x1050, 0x10A0, 0x7F0000000010], dtype=np.uint64)
    usable = np.array([24, 56, 56, 1052656], dtype=np.uint64)
    walk = HeapWalk(
        "2.36",
        "main_arena from libc's symbols; tcaches through each thread's TLS",
        addresses,
        usable,
        np.array([False, False, False, True]),
        (ArenaUse(0x7F1000000C60, True, 1, 3, 136, 2, 96, 132000),),
        1,
        (
            "main arena: the chunk at 0x2000 has size 0x7fff0, which runs past 0x3000: the rest of this "
            "heap was not walked",
        ),
        0.0021,
    )
    report = HeapReport(ProcessInfo(4242, "service"), walk, 0.0015, None)
    assert matches_golden("heap_summary", render_heap_text(report))
