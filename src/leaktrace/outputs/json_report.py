"""The JSON report: one object per snapshot, every process with its totals and growth,
every group with its frames."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

from leaktrace.analysis.growth import Growth, bytes_by_process, stack_id
from leaktrace.analysis.symbolize import SymbolizedSnapshot
from leaktrace.model.snapshot import AllocationGroup, LeakCheck, LeakKind, Peak, SiteTotals, UnreachableReport

if TYPE_CHECKING:
    from leaktrace.outputs.renderers import RenderContext

JSON_FORMAT = 1  # of the report's shape: raised on a change a reader of the old one would misread


def snapshot_to_dict(symbolized: SymbolizedSnapshot, growth: Growth = Growth()) -> dict:
    snap = symbolized.snapshot
    groups = sorted(snap.groups, key=lambda g: (g.pid, -g.bytes, g.size, g.stack, g.inherited))
    live = bytes_by_process(snap)
    counts: dict[int, int] = {}
    for g in snap.groups:
        counts[g.pid] = counts.get(g.pid, 0) + g.count
    peaks = {peak.pid: peak for peak in snap.peaks}
    highest = max(snap.peaks, key=lambda peak: (peak.bytes, -peak.pid), default=None)
    return {
        "format": JSON_FORMAT,
        "time": snap.taken_at,
        "live_bytes": snap.live_bytes,
        "live_allocations": snap.live_allocations,
        "backtrace_frames": snap.backtrace_frames,
        "counters": dataclasses.asdict(snap.counters),
        # False when allocations (or traced processes' blocks) are missing from the live figures.
        "complete": snap.counters.incompleteness() is None,
        "interval": growth.interval,
        "processes": [
            {
                "pid": p.pid,
                "comm": p.comm,
                "container": dataclasses.asdict(p.container) if p.container else None,
                "exited": p.exited,
                "forked": p.forked,
                "live_bytes": live.get(p.pid, 0),
                "live_allocations": counts.get(p.pid, 0),
                "growth_bytes": growth.of_process(p.pid).delta_bytes,
                "growth_bytes_per_s": growth.of_process(p.pid).rate,
                "peak_bytes": peaks[p.pid].bytes if p.pid in peaks else None,
                "peak_time": peaks[p.pid].time if p.pid in peaks else None,
            }
            for p in sorted(snap.processes.values(), key=lambda p: p.pid)
        ],
        "groups": [group_to_dict(symbolized, g, growth) for g in groups],
        "sites": [
            site_to_dict(symbolized, site)
            for site in sorted(snap.sites, key=lambda t: (t.pid, -t.allocated_bytes, t.size, t.stack))
        ],
        "peak": None if highest is None else peak_to_dict(symbolized, highest),
        "unreachable": None if snap.unreachable is None else unreachable_to_dict(symbolized, snap.unreachable),
        "leak_checks": [leak_check_to_dict(symbolized, check) for check in snap.leak_checks],
        "sample_rate": snap.sample_rate,
        "sample_seed": snap.sample_seed,
    }


def group_to_dict(symbolized: SymbolizedSnapshot, g: AllocationGroup, growth: Growth = Growth()) -> dict:
    return {
        "pid": g.pid,
        "size": g.size,
        "count": g.count,
        "bytes": g.bytes,
        "stack_status": g.stack_status.value,
        "inherited": g.inherited,
        "samples": g.samples,
        # Set when the live bytes of this group's stack rose in each of the last intervals.
        "likely_leak_bytes_per_s": growth.likely_leaks.get(stack_id(g)),
        "frames": [frame_to_dict(f) for f in symbolized.stack_of(g)],
    }


def site_to_dict(symbolized: SymbolizedSnapshot, site: SiteTotals) -> dict:
    return {
        "pid": site.pid,
        "size": site.size,
        "allocations": site.allocations,
        "allocated_bytes": site.allocated_bytes,
        "frees": site.frees,
        "short_lived": site.short_lived,
        "stack_status": site.stack_status.value,
        "samples": site.samples,
        "frames": [frame_to_dict(f) for f in symbolized.stack_of(site)],
    }


def peak_to_dict(symbolized: SymbolizedSnapshot, peak: Peak) -> dict:
    groups = sorted(peak.groups, key=lambda g: (-g.bytes, g.size, g.stack))
    return {
        "pid": peak.pid,
        "bytes": peak.bytes,
        "time": peak.time,
        "bound": peak.bound,
        "estimate": peak.estimate,
        "groups": [group_to_dict(symbolized, g) for g in groups],
    }


def leak_check_to_dict(symbolized: SymbolizedSnapshot, check: LeakCheck) -> dict:
    """valgrind's kinds: totals per kind (after the suppressions), every loss record with its
    frames, and what each suppression matched."""
    summary = {kind.value: check.total(kind) for kind in LeakKind} | {"suppressed": check.total(None)}
    return {
        "pid": check.pid,
        "command": check.command,
        "pause_seconds": check.pause_seconds,
        "summary": {name: {"bytes": size, "blocks": blocks} for name, (size, blocks) in summary.items()},
        "records": [
            {
                "kind": record.kind.value,
                "blocks": record.blocks,
                "bytes": record.bytes,
                "stack_status": record.stack_status.value,
                "suppressed_by": record.suppressed_by,
                "frames": [frame_to_dict(f) for f in symbolized.stack_of(record)],
            }
            for record in check.records
        ],
        "suppressions_used": [dataclasses.asdict(used) for used in check.suppressions_used],
    }


def unreachable_to_dict(symbolized: SymbolizedSnapshot, report: UnreachableReport) -> dict:
    fields = dataclasses.asdict(report)
    fields["leaks"] = [
        {
            **dataclasses.asdict(leak),
            "stack_status": leak.stack_status.value,
            "contents": leak.contents.hex(),
            "total_size": leak.total_size,
            "frames": [frame_to_dict(f) for f in symbolized.stack_of(leak)],
        }
        for leak in report.leaks
    ]
    for leak in fields["leaks"]:
        del leak["stack"]
    fields["seed_options"] = report.seed_options()
    return fields


def frame_to_dict(f) -> dict:
    return {
        "address": f.address,
        "function": f.function,
        "offset": f.offset,
        "module": f.module,
        "file": f.file,
        "line": f.line,
        "inlined": f.inlined,
        "kind": f.kind,  # "native", or an interpreter's name ("python"): a function it runs, at file:line
        **({"code_changed": True} if f.code_changed else {}),
    }


def render_json(symbolized: SymbolizedSnapshot, growth: Growth = Growth()) -> str:
    return json.dumps(snapshot_to_dict(symbolized, growth), separators=(",", ":")) + "\n"


def render(symbolized: SymbolizedSnapshot, context: RenderContext) -> bytes:
    return render_json(symbolized, context.growth).encode()
