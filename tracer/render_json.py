"""The JSON report: one object per snapshot, every group with its frames."""
from __future__ import annotations

import dataclasses
import json

from .symbolize import SymbolizedSnapshot


def snapshot_to_dict(symbolized: SymbolizedSnapshot) -> dict:
    snap = symbolized.snapshot
    groups = sorted(snap.groups, key=lambda g: (g.pid, -g.bytes, g.size, g.stack, g.inherited))
    return {
        "time": snap.taken_at,
        "live_bytes": snap.live_bytes,
        "live_allocations": snap.live_allocations,
        "backtrace_frames": snap.backtrace_frames,
        "counters": dataclasses.asdict(snap.counters),
        "processes": [{"pid": p.pid, "comm": p.comm, "exited": p.exited}
                      for p in sorted(snap.processes.values(), key=lambda p: p.pid)],
        "groups": [{
            "pid": g.pid, "size": g.size, "count": g.count, "bytes": g.bytes,
            "stack_status": g.stack_status.value, "inherited": g.inherited,
            "frames": [{"address": f.address, "function": f.function, "offset": f.offset,
                        "module": f.module, "file": f.file, "line": f.line}
                       for f in symbolized.stack_of(g)],
        } for g in groups],
    }


def render_json(symbolized: SymbolizedSnapshot) -> str:
    return json.dumps(snapshot_to_dict(symbolized), separators=(",", ":")) + "\n"
