"""leaktrace: native memory leaks of Linux processes, found with BPF uprobes.

Data flows one way: a source (sources/: the BPF engine through BpfTrace, the preload
library through PreloadTrace, the glibc heap walk) produces plain data (model/), a
Symbolizer (analysis/) turns it into a SymbolizedSnapshot, and renderers (outputs/,
android/) format it. docs/architecture.md has the map.
"""

import importlib
from typing import TYPE_CHECKING

# Name -> the module that defines it, imported on first use: the CLI would otherwise
# load every renderer before bcc's compile could start (start-up is timed to probes live).
_EXPORTS = {
    "EngineSettings": "sources.settings",
    "LeaktraceError": "errors",
    "RuntimeFailure": "errors",
    "UsageError": "errors",
    "MallocDebugConfig": "android.options",
    "OptionError": "android.options",
    "parse_malloc_debug_options": "android.options",
    "render_json": "outputs.json_report",
    "snapshot_to_dict": "outputs.json_report",
    "render_text": "outputs.text",
    "render_pprof": "outputs.pprof",
    "render_folded": "outputs.folded",
    "render_html": "outputs.html_page",
    "BpfTrace": "sources.bpf.trace",
    "AllocationGroup": "model.snapshot",
    "Counters": "model.snapshot",
    "Measure": "model.snapshot",
    "ProcessInfo": "model.snapshot",
    "Snapshot": "model.snapshot",
    "StackStatus": "model.snapshot",
    "UnreachableReport": "model.snapshot",
    "Frame": "analysis.symbolize",
    "SymbolizedSnapshot": "analysis.symbolize",
    "Symbolizer": "analysis.symbolize",
    "PreloadTrace": "sources.preload.trace",
    "HeapWalk": "reachability.glibc_heap",
    "walk_heap": "reachability.glibc_heap",
    "examine_heap": "reachability.unreachable",
}

if TYPE_CHECKING:  # the lazy exports, typed (tests/unit/test_public_api.py holds the two equal)
    from leaktrace.analysis.symbolize import Frame, SymbolizedSnapshot, Symbolizer
    from leaktrace.android.options import MallocDebugConfig, OptionError, parse_malloc_debug_options
    from leaktrace.errors import LeaktraceError, RuntimeFailure, UsageError
    from leaktrace.model.snapshot import (
        AllocationGroup,
        Counters,
        Measure,
        ProcessInfo,
        Snapshot,
        StackStatus,
        UnreachableReport,
    )
    from leaktrace.outputs.folded import render_folded
    from leaktrace.outputs.html_page import render_html
    from leaktrace.outputs.json_report import render_json, snapshot_to_dict
    from leaktrace.outputs.pprof import render_pprof
    from leaktrace.outputs.text import render_text
    from leaktrace.reachability.glibc_heap import HeapWalk, walk_heap
    from leaktrace.reachability.unreachable import examine_heap
    from leaktrace.sources.bpf.trace import BpfTrace
    from leaktrace.sources.preload.trace import PreloadTrace
    from leaktrace.sources.settings import EngineSettings

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
