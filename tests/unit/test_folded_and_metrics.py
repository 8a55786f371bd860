"""Folded stacks (flamegraph.pl, inferno, speedscope) and the agent's Prometheus exposition, of
synthetic snapshots."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from leaktrace import AllocationGroup, Counters, Frame, ProcessInfo, Snapshot, StackStatus, SymbolizedSnapshot
from leaktrace.analysis.growth import Growth
from leaktrace.outputs.folded import render_folded
from leaktrace.outputs.metrics import render_metrics

FRAMES = {
    (10, 0x10): Frame(0x10, "make;node", 0, "/opt/app/server"),
    (10, 0x20): Frame(0x20, "main", 0, "/opt/app/server"),
    (10, 0x30): Frame(0x30, None, 0x1234, "/usr/lib/libc.so.6"),
    (11, 0x40): Frame(0x40),
}
INLINED = {(10, 0x10): (Frame(0x10, "alloc_node", 0, "/opt/app/server", inlined=True),)}


def symbolized(groups, sample_rate: int = 0) -> SymbolizedSnapshot:
    processes = {10: ProcessInfo(10, "server"), 11: ProcessInfo(11, "work;er")}
    snapshot = Snapshot(1.0, tuple(groups), Counters(allocations=40, frees=9, unknown_frees=3), processes)
    if sample_rate:
        snapshot = Snapshot(1.0, tuple(groups), Counters(), processes, sample_rate=sample_rate)
    return SymbolizedSnapshot(snapshot, FRAMES, INLINED)


GROUPS = [
    AllocationGroup(10, 64, 3, (0x10, 0x20, 0x30)),
    AllocationGroup(10, 32, 1, (0x10, 0x20, 0x30)),
    AllocationGroup(11, 8, 2, (0x40,), inherited=True),
    AllocationGroup(10, 1 << 20, 1, (), StackStatus.FILTERED),
    AllocationGroup(10, 16, 0, (0x20,)),  # nothing live: no line
]


def test_folded_lines_root_first_with_markers_and_no_stray_separator():
    assert render_folded(symbolized(GROUPS)).splitlines() == [
        "server (10);[filtered] 1048576",
        "server (10);libc.so.6+0x1234;main;make:node;alloc_node (inlined) 224",  # inlined: the leaf
        "work:er (11);[inherited];0x40 16",
    ]


def test_metrics_per_process_totals_and_one_series_per_drop_counter():
    text = render_metrics(symbolized(GROUPS), Growth(), top_processes=1, min_bytes=0, report_seconds=0.25).decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    [live] = families["leaktrace_live_bytes"].samples  # top_processes=1: the largest only
    assert (live.labels["pid"], live.labels["comm"], live.value) == ("10", "server", 1048576 + 224)
    assert families["leaktrace_allocations"].samples[0].value == 40
    drops = {sample.labels["counter"]: sample.value for sample in families["leaktrace_drops"].samples}
    assert drops["unknown_frees"] == 3 and set(drops) == set(Counters.loss_names())
    assert families["leaktrace_report_seconds"].samples[0].value == 0.25
    assert families["leaktrace_sample_rate_bytes"].samples[0].value == 0
    # No peak or totals followed in this snapshot: zeros, in the same series as the live bytes.
    assert [sample.value for sample in families["leaktrace_peak_bytes"].samples] == [0]
    assert [sample.value for sample in families["leaktrace_allocated_bytes"].samples] == [0]


def test_metrics_say_when_the_values_are_estimates():
    text = render_metrics(symbolized(GROUPS, 512 << 10), Growth(), 10, 0, 0.1).decode()
    assert "estimated from samples" in text and "leaktrace_sample_rate_bytes 524288.0" in text
