"""leaktrace: native memory leaks of Linux processes, found with BPF uprobes.

Data flows one way: a source (BpfEngine through Trace) produces a Snapshot,
a Symbolizer turns it into a SymbolizedSnapshot, and renderers format it.
"""
import importlib
import sys
import types

# Name -> the module that defines it, imported on first use: the CLI would otherwise
# load every renderer before bcc's compile could start (start-up is timed to probes live).
_EXPORTS = {
    "EngineSettings": "bpf_compile",
    "LeaktraceError": "errors", "RuntimeFailure": "errors", "UsageError": "errors",
    "MallocDebugConfig": "malloc_options", "OptionError": "malloc_options",
    "parse_malloc_debug_options": "malloc_options",
    "render_json": "render_json", "snapshot_to_dict": "render_json",
    "render_text": "render_text", "render_pprof": "render_pprof", "render_folded": "render_folded",
    "render_html": "render_html",
    "Trace": "session",
    "AllocationGroup": "snapshot", "Counters": "snapshot", "ProcessInfo": "snapshot", "Snapshot": "snapshot",
    "StackStatus": "snapshot",
    "Frame": "symbolize", "SymbolizedSnapshot": "symbolize", "Symbolizer": "symbolize",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    """Importing a module named as the function it exports (render_text) must not make the
    package's name for that function the module (the import system sets it on the package)."""

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, types.ModuleType) and _EXPORTS.get(name) == name:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
