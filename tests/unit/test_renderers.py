"""Every report format behind one interface in one table (outputs/renderers.py): the reports on
standard output and the files."""

from __future__ import annotations

import importlib
import json

from each import each

from leaktrace import AllocationGroup, Counters, Frame, ProcessInfo, Snapshot, SymbolizedSnapshot
from leaktrace.analysis.growth import Growth
from leaktrace.outputs.renderers import FILE_FORMATS, RENDERERS, RenderContext

FRAMES = {(10, 0x10): Frame(0x10, "make_node", 0, "/opt/app/server"), (11, 0x10): Frame(0x10, "work", 0, "/w")}


def symbolized() -> SymbolizedSnapshot:
    snapshot = Snapshot(
        1.0,
        (AllocationGroup(10, 64, 3, (0x10,)), AllocationGroup(11, 8, 1, (0x10,))),
        Counters(allocations=4),
        {10: ProcessInfo(10, "server"), 11: ProcessInfo(11, "worker")},
    )
    return SymbolizedSnapshot(snapshot, FRAMES)


def test_each_entry_is_a_module_with_render():
    for name, entry in RENDERERS.items():
        assert entry.name == name
        assert callable(importlib.import_module(f"leaktrace.outputs.{entry.module}").render)
    assert {entry.name for entry in FILE_FORMATS} == {"pprof", "folded", "html"}
    assert all(entry.help and entry.what for entry in each(FILE_FORMATS))


def test_each_entry_renders_the_snapshot_in_its_own_form():
    context = RenderContext(Growth(), top=5)
    text = RENDERERS["text"].render(symbolized(), context).decode()
    assert "make_node" in text and "top 2 of 2 stacks by live bytes:" in text
    per_process = RENDERERS["processes"].render(symbolized(), context).decode()
    assert "pid 10 (server)" in per_process and "pid 11 (worker)" in per_process
    report = json.loads(RENDERERS["json"].render(symbolized(), context))
    assert report["live_bytes"] == 200 and [g["count"] for g in report["groups"]] == [3, 1]
    for output in FILE_FORMATS:
        data = output.render(symbolized(), RenderContext(Growth(), 1.5))
        assert isinstance(data, bytes) and data, output.name
