"""Every report format behind one interface in one table (outputs/renderers.py): the reports on
standard output and the files."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

from each import each

import leaktrace.commands
from leaktrace import AllocationGroup, Counters, Frame, ProcessInfo, Snapshot, SymbolizedSnapshot
from leaktrace.analysis.growth import Growth
from leaktrace.outputs.renderers import RENDERERS, RenderContext, Report

FRAMES = {(10, 0x10): Frame(0x10, "make_node", 0, "/opt/app/server"), (11, 0x10): Frame(0x10, "work", 0, "/w")}


def symbolized() -> SymbolizedSnapshot:
    snapshot = Snapshot(
        1.0,
        (AllocationGroup(10, 64, 3, (0x10,)), AllocationGroup(11, 8, 1, (0x10,))),
        Counters(allocations=4),
        {10: ProcessInfo(10, "server"), 11: ProcessInfo(11, "worker")},
    )
    return SymbolizedSnapshot(snapshot, FRAMES)


def test_each_entry_names_a_typed_function_and_a_media_type():
    assert [entry.name for entry in RENDERERS.entries()] == [field.name for field in dataclasses.fields(RENDERERS)]
    for entry in each(RENDERERS.entries()):
        assert callable(entry.render) and re.fullmatch(r"[a-z]+/[a-z0-9.+-]+(; .+)?", entry.media_type), entry
    assert [entry.name for entry in RENDERERS.file_formats()] == ["pprof", "folded", "html"]
    assert all(entry.option_help and entry.what for entry in each(RENDERERS.file_formats()))


def test_the_report_entries_render_the_snapshot_in_their_own_form():
    context = RenderContext(Growth(), top=5)
    text = RENDERERS.text.render(Report(symbolized(), context)).decode()
    assert "make_node" in text and "top 2 of 2 stacks by live bytes:" in text
    per_process = RENDERERS.processes.render(Report(symbolized(), context)).decode()
    assert "pid 10 (server)" in per_process and "pid 11 (worker)" in per_process
    report = json.loads(RENDERERS.json.render(Report(symbolized(), context)))
    assert report["live_bytes"] == 200 and [g["count"] for g in report["groups"]] == [3, 1]
    metrics = RENDERERS.metrics.render(Report(symbolized(), context)).decode()
    assert 'leaktrace_live_bytes{comm="server",container_id="",exe="",pid="10",pod_uid=""} 192.0' in metrics
    for output in each(RENDERERS.file_formats()):
        data = output.render(Report(symbolized(), RenderContext(Growth(), 1.5)))
        assert isinstance(data, bytes) and data, output.name


RENDERING_FOLDERS = ("leaktrace.outputs", "leaktrace.android")


def test_no_command_calls_a_renderer_but_through_the_table():
    """The trace command, the gate, Android's files, the agent, heap and diff: each takes its
    entries from RENDERERS, never a module's render function."""
    commands = Path(leaktrace.commands.__file__).parent
    direct = [
        f"{path.name}: {alias.name}"
        for path in each(sorted(commands.glob("*.py")))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").startswith(("leaktrace.outputs", "leaktrace.android"))
        for alias in node.names
        if alias.name.startswith("render")
    ]
    assert not direct
