"""leaktrace: native memory leaks of Linux processes, found with BPF uprobes.

Data flows one way: a source (BpfEngine through Trace) produces a Snapshot,
a Symbolizer turns it into a SymbolizedSnapshot, and renderers format it.
"""
from .bpf_engine import EngineSettings
from .errors import LeaktraceError, RuntimeFailure, UsageError
from .malloc_options import MallocDebugConfig, OptionError, parse_malloc_debug_options
from .render_json import render_json, snapshot_to_dict
from .render_text import render_text
from .session import Trace
from .snapshot import AllocationGroup, Counters, ProcessInfo, Snapshot, StackStatus
from .symbolize import Frame, SymbolizedSnapshot, Symbolizer

__all__ = [
    "AllocationGroup", "Counters", "EngineSettings", "Frame", "LeaktraceError", "MallocDebugConfig",
    "OptionError", "ProcessInfo", "RuntimeFailure", "Snapshot", "StackStatus", "SymbolizedSnapshot",
    "Symbolizer", "Trace", "UsageError", "parse_malloc_debug_options", "render_json", "render_text",
    "snapshot_to_dict",
]
