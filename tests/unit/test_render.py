"""Renderers are pure functions of a symbolized snapshot: tested with synthetic ones."""

from __future__ import annotations

import dataclasses
import gzip
import json
import time

from leaktrace import (
    AllocationGroup,
    Counters,
    Frame,
    ProcessInfo,
    Snapshot,
    StackStatus,
    SymbolizedSnapshot,
    render_json,
    render_text,
)
from leaktrace.model.snapshot import Peak, SiteTotals
from leaktrace.outputs.folded import render_folded
from leaktrace.outputs.pprof import profile_class, render_pprof

FRAMES = {
    (10, 0x1010): Frame(0x1010, "make_node", 0x10, "/opt/app/bin/server", "node.c", 42),
    (10, 0x2020): Frame(0x2020, "main", 0x20, "/opt/app/bin/server", "main.c", 7),
    (10, 0x3030): Frame(0x3030, None, 0x3030, "/usr/lib/libc.so.6"),
    (11, 0x4040): Frame(0x4040),
}


def snapshot(groups, processes=None, counters=Counters(allocations=30, frees=5, unknown_frees=2)):
    processes = processes or {10: ProcessInfo(10, "server")}
    return SymbolizedSnapshot(Snapshot(1_700_000_000.0, tuple(groups), counters, processes), FRAMES)


def test_text_ranks_stacks_by_bytes_and_merges_sizes():
    stack = (0x1010, 0x2020, 0x3030)
    text = render_text(
        snapshot(
            [
                AllocationGroup(10, 24, 3, stack),
                AllocationGroup(10, 4096, 2, stack),
                AllocationGroup(10, 10000, 1, (), StackStatus.FILTERED),
                AllocationGroup(10, 16, 4, (), StackStatus.LOST),
            ]
        )
    )
    lines = text.splitlines()
    assert lines[0].endswith(
        "pid 10 (server): 18328 live bytes in 10 allocations (30 allocated, 5 freed since the trace began)"
    )
    assert lines[1].startswith("drops: live_map_full 0, ") and "unknown_frees 2" in lines[1]
    assert lines[2] == "top 3 of 3 stacks by live bytes:"
    body = "\n".join(lines[3:])
    assert body.index("10000") < body.index("8264") < body.index("16 x4")
    assert "4096 x2, 24 x3" in body
    assert "make_node+0x10 (server) node.c:42" in body
    assert "0x3030 (libc.so.6+0x3030)" in body
    assert "(no stack: size outside the backtrace size range)" in body
    assert "(stack lost: see the drop counters)" in body


def test_text_top_and_empty():
    groups = [AllocationGroup(10, size, 1, (0x1010,)) for size in (1, 2, 3)]
    text = render_text(snapshot(groups), top=1)
    assert "top 1 of 1 stacks" in text  # same stack: one row
    assert render_text(snapshot([])).splitlines()[-1] == "no live allocations"


def test_text_and_json_say_when_allocations_are_missing():
    counters = Counters(allocations=5, live_map_full=5, unfollowed_children=2)
    text = render_text(snapshot([], counters=counters)).splitlines()
    assert text[1] == (
        "INCOMPLETE: live figures are low (up to 5 allocations missing: live_map_full 5, unfollowed_children 2)"
    )
    assert text[-1] == "no live allocations recorded"
    assert json.loads(render_json(snapshot([], counters=counters)))["complete"] is False
    assert json.loads(render_json(snapshot([])))["complete"] is True


def test_text_keeps_inherited_blocks_apart():
    groups = [AllocationGroup(10, 8, 2, (0x1010,)), AllocationGroup(10, 8, 1, (0x1010,), inherited=True)]
    text = render_text(snapshot(groups))
    assert "top 2 of 2 stacks" in text
    rows = [line for line in text.splitlines() if "make_node" in line]
    assert [row.split()[:3] for row in rows] == [["16", "2", "8"], ["8", "1", "8"]]
    assert "(inherited)" in rows[1] and "(inherited)" not in rows[0]
    report = json.loads(render_json(snapshot(groups)))
    assert [g["inherited"] for g in report["groups"]] == [False, True]


def test_text_several_processes_get_a_pid_column():
    text = render_text(
        snapshot(
            [AllocationGroup(10, 8, 1, (0x1010,)), AllocationGroup(11, 8, 2, (0x4040,))],
            processes={10: ProcessInfo(10, "server"), 11: ProcessInfo(11, "worker", exited=True)},
        )
    )
    assert "pid 10 (server), 11 (worker) exited" in text
    assert text.splitlines()[3].split()[0] == "pid"
    assert "0x4040 [unknown]" in text


def test_json_carries_every_group_and_frame():
    out = render_json(
        snapshot([AllocationGroup(10, 24, 3, (0x1010, 0x2020)), AllocationGroup(10, 7, 1, (), StackStatus.FILTERED)])
    )
    assert out.endswith("\n") and out.count("\n") == 1
    report = json.loads(out)
    assert report["live_bytes"] == 79 and report["live_allocations"] == 4
    assert report["counters"]["unknown_frees"] == 2
    assert report["processes"] == [
        {
            "pid": 10,
            "comm": "server",
            "container": None,
            "exited": False,
            "forked": False,
            "live_bytes": 79,
            "live_allocations": 4,
            "growth_bytes": 0,
            "growth_bytes_per_s": 0.0,
            "peak_bytes": None,
            "peak_time": None,
        }
    ]
    assert report["sites"] == [] and report["peak"] is None
    first, second = report["groups"]
    assert first == {
        "pid": 10,
        "size": 24,
        "count": 3,
        "bytes": 72,
        "stack_status": "captured",
        "inherited": False,
        "samples": None,
        "likely_leak_bytes_per_s": None,
        "frames": [
            {
                "address": 0x1010,
                "function": "make_node",
                "offset": 0x10,
                "module": "/opt/app/bin/server",
                "file": "node.c",
                "line": 42,
                "inlined": False,
                "kind": "native",
            },
            {
                "address": 0x2020,
                "function": "main",
                "offset": 0x20,
                "module": "/opt/app/bin/server",
                "file": "main.c",
                "line": 7,
                "inlined": False,
                "kind": "native",
            },
        ],
    }
    assert second["stack_status"] == "filtered" and second["frames"] == []


def test_every_json_report_says_its_format():
    from leaktrace.analysis.symbolize import SymbolizedSnapshot
    from leaktrace.model.snapshot import Counters, Snapshot
    from leaktrace.outputs.json_report import JSON_FORMAT, snapshot_to_dict

    report = snapshot_to_dict(SymbolizedSnapshot(Snapshot(0.0, (), Counters()), {}))
    assert report["format"] == JSON_FORMAT == 1 and next(iter(report)) == "format"


def test_the_drops_line_says_why_stacks_were_truncated():
    from leaktrace.outputs.text import drops_text

    counters = Counters(allocations=9, stacks_truncated=5, stacks_truncated_no_tables=2, stacks_truncated_no_rule=3)
    line = drops_text(counters)
    assert line.endswith("stacks_truncated 5 (no_tables 2, no_rule 3)")
    assert "stacks_truncated_no_tables" not in line
    assert drops_text(Counters(allocations=9)) == "drops: none"


def test_the_html_page_lists_the_top_stacks_with_their_frames():
    from leaktrace.outputs.html_page import render_html

    page = render_html(snapshot([AllocationGroup(10, 24, 3, (0x1010, 0x2020)), AllocationGroup(10, 8, 1, (0x3030,))]))
    table = page.split("<table id='stacks-table'>", 1)[1].split("</table>", 1)[0]
    rows = table.split("<tbody>", 1)[1].split("</tr>")[:-1]
    assert len(rows) == 2
    assert "make_node+0x10 (server) node.c:42<br>main+0x20 (server) main.c:7" in rows[0]
    assert "<td>72</td><td>3</td><td>24 x3</td>" in rows[0]
    assert "id='filter'" in page and 'getElementById("filter").oninput' in page


def test_valgrind_xml_takes_any_command_line_a_target_has():
    """A judged command line is its arguments joined by spaces, as /proc gives them: one with
    an unbalanced quote (sh -c "echo it's") or a control character still renders, and XML
    parses it."""
    from xml.etree import ElementTree

    from leaktrace.analysis.suppressions import LeakCheckSettings
    from leaktrace.model.snapshot import LeakCheck, LeakKind, LossRecord
    from leaktrace.outputs.valgrind_xml import render_valgrind_xml

    record = LossRecord(10, LeakKind.DEFINITE, 1, 64, (0x1010, 0x2020))
    check = LeakCheck(10, (record,), 0.001, command="sh -c echo it's \x01done")
    document = ElementTree.fromstring(render_valgrind_xml(snapshot([]), check, LeakCheckSettings(), ["leaktrace"]))
    assert [arg.text for arg in document.iter("arg")][-2:] == ["it's", "\ufffddone"]
    assert [frame.findtext("fn") for frame in document.iter("frame")] == ["make_node", "main"]


STACK = (0x1010, 0x2020)


def viewed() -> SymbolizedSnapshot:
    """A process that made 100 blocks of 64 at make_node (10 live, 80 short-lived), one of 4096
    at main (freed), and peaked at 8 blocks of 4096 plus 20 of 64."""
    sites = (
        SiteTotals(10, 64, 100, 90, 80, STACK),
        SiteTotals(10, 4096, 8, 8, 0, STACK[1:]),
    )
    peak = Peak(
        10,
        8 * 4096 + 20 * 64,
        1_700_000_000.0,
        (AllocationGroup(10, 4096, 8, STACK[1:]), AllocationGroup(10, 64, 20, STACK)),
        bound=340,
    )
    symbolized = snapshot([AllocationGroup(10, 64, 10, STACK)])
    return dataclasses.replace(
        symbolized, snapshot=dataclasses.replace(symbolized.snapshot, sites=sites, peaks=(peak,))
    )


def test_json_carries_the_totals_and_the_peak():
    report = json.loads(render_json(viewed()))
    assert [
        (s["size"], s["allocations"], s["allocated_bytes"], s["frees"], s["short_lived"]) for s in report["sites"]
    ] == [
        (4096, 8, 32768, 8, 0),
        (64, 100, 6400, 90, 80),
    ]
    peak = report["peak"]
    assert (peak["pid"], peak["bytes"], peak["bound"], peak["estimate"]) == (10, 34048, 340, False)
    assert [(g["size"], g["count"], g["frames"][0]["function"]) for g in peak["groups"]] == [
        (4096, 8, "main"),
        (64, 20, "make_node"),
    ]
    assert report["processes"][0]["peak_bytes"] == 34048


def test_each_measure_ranks_the_text_table_and_draws_the_folded_stacks():
    symbolized = viewed()
    tables = {
        measure: render_text(symbolized, measure=measure).splitlines()
        for measure in ("live", "allocated", "peak", "short-lived")
    }
    assert tables["live"][2] == "top 1 of 1 stacks by live bytes:"
    assert tables["allocated"][2] == "top 2 of 2 stacks by bytes allocated since the trace began:"
    assert tables["allocated"][5].split()[:2] == ["32768", "8"]
    assert tables["peak"][5].split()[:2] == ["32768", "8"]
    assert tables["short-lived"][5].split()[:2] == ["5120", "80"]
    assert tables["live"][-1] == (
        "peak of pid 10: 34048 live bytes at "
        f"{time.strftime('%H:%M:%S', time.localtime(1_700_000_000.0))}; its stacks from a moment up to 340 bytes away "
        "(34048 bytes)"
    )
    folded = {measure: render_folded(symbolized, measure) for measure in ("allocated", "peak", "short-lived")}
    assert folded["allocated"] == "server (10);main 32768\nserver (10);main;make_node 6400\n"
    assert folded["peak"] == "server (10);main 32768\nserver (10);main;make_node 1280\n"
    assert folded["short-lived"] == "server (10);main;make_node 5120\n"


def test_pprof_has_go_heap_profiles_four_sample_types_and_the_measures_default():
    for measure, default, values in (
        ("live", "inuse_space", [[100, 6400, 10, 640], [8, 32768, 0, 0]]),
        ("peak", "inuse_space", [[8, 32768, 8, 32768], [100, 6400, 20, 1280]]),
        ("allocated", "alloc_space", [[100, 6400, 10, 640], [8, 32768, 0, 0]]),
        ("short-lived", "short_lived_space", [[100, 6400, 10, 640, 80, 5120], [8, 32768, 0, 0, 0, 0]]),
    ):
        profile = profile_class().FromString(gzip.decompress(render_pprof(viewed(), measure=measure)))
        text = list(profile.string_table)
        assert text[profile.default_sample_type] == default
        assert [list(sample.value) for sample in profile.sample] == values, measure


def test_process_rows_carry_the_peak_and_totals_the_top_view_sorts_by():
    from leaktrace.analysis.growth import Growth
    from leaktrace.analysis.process_table import SORT_KEYS, process_rows
    from leaktrace.outputs.top_view import SORT_BY_KEY

    (row,) = process_rows(viewed(), Growth())
    assert (row.peak_bytes, row.allocated_bytes, row.short_lived) == (34048, 39168, 80)
    assert {SORT_BY_KEY[key] for key in "pts"} == {"peak", "allocated", "short-lived"} <= set(SORT_KEYS)


def test_the_top_view_shows_the_column_of_a_measure_it_sorts_by():
    from leaktrace.analysis.growth import Growth
    from leaktrace.outputs.top_view import ViewState, render_top_screen

    default = render_top_screen(viewed(), Growth(), ViewState())
    by_peak = render_top_screen(viewed(), Growth(), ViewState(sort="peak"))
    header = next(i for i, line in enumerate(default) if line.split()[:2] == ["PID", "COMM"])
    assert "PEAK" not in default[header] and by_peak[header].split()[5] == "PEAK"
    assert by_peak[header + 1].split()[5] == "33.2KiB"


def test_the_html_page_draws_the_measure_and_says_the_peak():
    from leaktrace.outputs.html_page import flame_tree, render_html

    page = render_html(viewed(), measure="peak")
    assert (
        "<h2>Bytes live at the peak by stack</h2>" in page and "<h2>Top stacks by bytes live at the peak</h2>" in page
    )
    assert "<h2>Peak</h2><p>peak of pid 10: 34048 live bytes at " in page
    assert flame_tree(viewed(), "peak")["value"] == 34048 and flame_tree(viewed(), "allocated")["value"] == 39168
    assert flame_tree(viewed(), "short-lived")["value"] == 80 * 64


def test_short_lived_blocks_of_a_sampled_trace_are_said_to_be_uncounted():
    """--measure short-lived --sample: the library and the kernel follow no short-lived block
    when sampling, which the table says rather than "no stacks"."""
    symbolized = viewed()
    sampled = dataclasses.replace(
        symbolized,
        snapshot=dataclasses.replace(
            symbolized.snapshot,
            sample_rate=4096,
            sites=tuple(dataclasses.replace(s, short_lived=None) for s in symbolized.snapshot.sites),
        ),
    )
    text = render_text(sampled, measure="short-lived")
    assert "short-lived blocks are not counted when sampled (--sample)" in text and "no stacks by" not in text, text
