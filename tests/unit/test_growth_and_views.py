"""The growth signal, the systemwide report and the top view's screen: pure functions,
tested with synthetic snapshots."""

from __future__ import annotations

import json
import math
import os
import random
import re

import pytest
from each import each

from leaktrace import AllocationGroup, Counters, Frame, ProcessInfo, Snapshot, SymbolizedSnapshot, render_json
from leaktrace.analysis.growth import GrowthTracker
from leaktrace.analysis.process_table import process_rows, sort_rows
from leaktrace.model.snapshot import keep_probability
from leaktrace.outputs.process_report import render_process_report
from leaktrace.outputs.top_view import ViewState, parse_size_range, render_top_screen, table_pids

FRAMES = {
    (10, 0x1010): Frame(0x1010, "grow_cache", 0x10, "/opt/app/server", "cache.c", 12),
    (10, 0x2020): Frame(0x2020, "parse", 0x20, "/opt/app/server", "parse.c", 40),
    (20, 0x3030): Frame(0x3030, "worker_loop", 0x8, "/opt/app/worker"),
}
PROCESSES = {10: ProcessInfo(10, "server"), 20: ProcessInfo(20, "worker")}


def snapshot(at: float, cache_blocks: int, parse_blocks: int = 2, worker_blocks: int = 1) -> Snapshot:
    groups = [
        AllocationGroup(10, 64, cache_blocks, (0x1010,)),
        AllocationGroup(10, 512, parse_blocks, (0x2020,)),
        AllocationGroup(20, 4096, worker_blocks, (0x3030,)),
    ]
    return Snapshot(at, tuple(g for g in groups if g.count), Counters(allocations=100, frees=40), PROCESSES)


def symbolized(snap: Snapshot) -> SymbolizedSnapshot:
    return SymbolizedSnapshot(snap, FRAMES)


def test_a_stack_is_a_likely_leak_after_rising_in_each_of_the_last_intervals():
    tracker = GrowthTracker(intervals=3)
    # The cache grows by 10 blocks a second; parse rises once, then falls back.
    shapes = [(0, 10, 2), (1, 20, 3), (2, 30, 2), (3, 40, 2)]
    results = [tracker.observe(snapshot(t, cache, parse)) for t, cache, parse in shapes]
    assert [r.likely_leaks for r in results[:3]] == [{}, {}, {}]
    leaks = results[3].likely_leaks
    assert list(leaks) == [(10, (0x1010,), "captured", False)]
    assert leaks[10, (0x1010,), "captured", False] == pytest.approx(30 * 64 / 3)
    assert results[3].of_process(10).delta_bytes == 640
    assert results[3].of_process(10).rate == pytest.approx(640)
    assert results[3].of_process(20).delta_bytes == 0
    # One interval without a rise ends the flag.
    assert tracker.observe(snapshot(4, 40, 2)).likely_leaks == {}


def test_process_rows_sort_by_each_key():
    growth = GrowthTracker().observe(snapshot(0, 10))
    rows = process_rows(symbolized(snapshot(0, 10)), growth)
    assert [(r.pid, r.live_bytes, r.live_allocations) for r in rows] == [(20, 4096, 1), (10, 1664, 12)]
    assert rows[1].top_site == "parse+0x20 (server) parse.c:40"  # 1024 bytes beat 640
    assert [r.pid for r in sort_rows(rows, "allocs")] == [10, 20]
    assert [r.pid for r in sort_rows(rows, "pid")] == [10, 20]
    assert [r.pid for r in sort_rows(rows, "pid", reverse=True)] == [20, 10]
    assert [r.pid for r in sort_rows(rows, "comm")] == [10, 20]


def test_systemwide_report_lists_processes_then_likely_leaks_then_stacks():
    tracker = GrowthTracker(intervals=2)
    for t, cache in ((0, 10), (1, 20)):
        tracker.observe(snapshot(t, cache))
    last = snapshot(2, 30)
    text = render_process_report(symbolized(last), tracker.observe(last), top_processes=5, top_stacks=1, min_bytes=2000)
    lines = text.splitlines()
    assert re.match(r"\[\d\d:\d\d:\d\d\] 2 processes: 7040 live bytes in 33 allocations", lines[0])
    assert lines[1].startswith("drops: ")
    assert lines[2] == "top 2 of 2 processes by live bytes:"
    assert re.match(r" +20 +worker +4096 +1 +\+0 +\+0 B/s", lines[5])
    assert re.match(r" +10 +server +2944 +32 +\+640 +\+640 B/s", lines[6])
    assert lines[7] == "likely leaks (live bytes rose in each of the last 2 intervals):"
    assert re.search(r"1920 +30 +64 x30 +\+640 B/s +grow_cache\+0x10 \(server\) cache.c:12", text)
    assert "pid 20 (worker): top 1 of 1 stacks by live bytes:" in text
    assert "pid 10 (server): top 1 of 2 stacks by live bytes:" in text
    fewer = render_process_report(symbolized(last), tracker.observe(last), min_bytes=3000)
    assert "top 1 of 1 processes by live bytes (1 under 3000 bytes left out):" in fewer
    report = json.loads(render_json(symbolized(last), tracker.observe(snapshot(3, 40))))
    server = next(p for p in report["processes"] if p["pid"] == 10)
    assert (server["live_bytes"], server["live_allocations"]) == (2944, 32)


def test_top_screen_table_detail_filters_and_help():
    tracker = GrowthTracker(intervals=1)
    tracker.observe(snapshot(0, 10))
    last = snapshot(1, 20)
    growth = tracker.observe(last)
    state = ViewState(interval=2)
    lines = render_top_screen(symbolized(last), growth, state)
    assert lines[0].startswith("leaktrace ") and "every 2s  sort live" in lines[0]
    assert "processes 2  live 6.2KiB in 23 allocations  growth 640B/s  likely leaks 1" in lines[1]
    assert lines[4].split()[:2] == ["PID", "COMM"]
    assert lines[5].split()[:2] == ["20", "worker"] and lines[6].split()[:2] == ["10", "server"]
    assert lines[6].split()[4] == "640B/s!"  # the process with a likely leak
    assert table_pids(symbolized(last), growth, state) == [20, 10]

    state.size_range = parse_size_range("0-100")
    assert table_pids(symbolized(last), growth, state) == [10]
    assert "[sizes 0-100]" in render_top_screen(symbolized(last), growth, state)[0]
    state.size_range = None
    state.comm_filter = re.compile("^work")
    assert table_pids(symbolized(last), growth, state) == [20]
    state.comm_filter = None

    state.detail_pid = 10
    detail = render_top_screen(symbolized(last), growth, state)
    assert detail[4].startswith("pid 10 (server): 2.2KiB live in 22 allocations")
    assert "1.2KiB in 20 allocations (64 x20)  LEAK? 640B/s" in detail
    assert "    grow_cache+0x10 (server) cache.c:12" in detail
    state.show_help = True
    assert render_top_screen(symbolized(last), growth, state)[0] == "leaktrace top view: keys"


def test_size_ranges():
    assert parse_size_range("64-512") == (64, 512)
    assert parse_size_range("64-") == (64, 2**64 - 1)
    assert parse_size_range("-512") == (0, 512)
    assert parse_size_range("24") == (24, 24)
    assert parse_size_range("") is None
    for bad in ("x", "512-64", "1-2-3"):
        with pytest.raises(ValueError):
            parse_size_range(bad)


def test_reports_that_fell_behind_are_skipped_not_made_in_a_burst():
    from leaktrace.commands.report_loop import next_report_time

    assert next_report_time(10.0, 5.0, 12.0) == 15.0  # on time: one interval on
    assert next_report_time(10.0, 5.0, 15.0) == 20.0  # due exactly now: the next one
    assert next_report_time(10.0, 5.0, 36.0) == 40.0  # 26 s late: the grid's next point, not five at once


def test_the_top_views_filters_keep_inlined_frames():
    from leaktrace.outputs.top_view import filtered

    snapshot = Snapshot(1.0, (AllocationGroup(7, 24, 1, (0x10,)),), Counters(), {7: ProcessInfo(7, "prog")})
    inlined = {(7, 0x10): (Frame(0x10, "helper", 0, "/bin/prog", inlined=True),)}
    symbolized = SymbolizedSnapshot(snapshot, {(7, 0x10): Frame(0x10, "caller", 0x4, "/bin/prog")}, inlined)
    kept = filtered(symbolized, ViewState(size_range=(1, 100)))
    assert [frame.function for frame in kept.stack_of(kept.snapshot.groups[0])] == ["helper", "caller"]


def poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw (Knuth's product of uniforms; means well under 700)."""
    limit, draws, product = math.exp(-mean), 0, rng.random()
    while product > limit:
        draws, product = draws + 1, product * rng.random()
    return draws


def sampled_snapshot(at: float, samples: dict[int, int], rate: int) -> Snapshot:
    """Stacks of pid 10 as a sampled source reports them (0x2020: 4 KiB blocks, the others
    64 bytes): the count each stack's samples stand for."""
    groups = []
    for address, kept in samples.items():
        size = 4096 if address == 0x2020 else 64
        count = round(kept / keep_probability(size, rate))
        groups.append(AllocationGroup(10, size, count, (address,), samples=kept))
    return Snapshot(at, tuple(groups), Counters(), PROCESSES, sample_rate=rate)


def test_sampling_noise_of_steady_stacks_is_not_taken_for_growth():
    """Two steady stacks whose blocks are all replaced each interval (a hundred samples of
    small blocks, ten of pages, at 512 KiB), the worst case for noise: in 6,000
    stack-intervals at most 3 are flagged, though the estimates wander. A leak of 8 MiB an
    interval beside them (16 samples) is flagged from the first judged interval, and stays
    flagged as it grows for 60 intervals."""
    # A bound on chance (at most 3 in 6,000) fails now and then on a fresh seed: seeded, and
    # LEAKTRACE_TEST_SEED tries others.
    seed = int(os.environ.get("LEAKTRACE_TEST_SEED") or 1129)
    print(f"seed {seed}")
    rng, rate = random.Random(seed), 512 << 10
    tracker = GrowthTracker(intervals=3)
    flagged, rises = 0, 0
    before = None
    for interval in range(3000):
        samples = {0x1010: poisson(rng, 100), 0x2020: poisson(rng, 10)}
        growth = tracker.observe(sampled_snapshot(interval, samples, rate))
        flagged += len(growth.likely_leaks)
        rises += before is not None and samples[0x1010] > before
        before = samples[0x1010]
    assert flagged <= 3 and rises > 1000, (flagged, rises, seed)

    tracker, leaked = GrowthTracker(intervals=3), 0
    results = []
    for interval in range(60):
        leaked += poisson(rng, 8 * (1 << 20) * keep_probability(64, rate) / 64)
        samples = {0x1010: poisson(rng, 100), 0x2020: poisson(rng, 10), 0x4040: leaked}
        results.append(tracker.observe(sampled_snapshot(interval, samples, rate)).likely_leaks)
    assert all(not leaks for leaks in each(results[:6])), results[:6]
    assert all(list(leaks) == [(10, (0x4040,), "captured", False)] for leaks in each(results[6:])), (results, seed)
