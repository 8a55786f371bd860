"""Every module of the package is imported by a unit test, or listed here with the reason it
cannot be; a listed module that a unit test has come to import leaves the list."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
PACKAGE = ROOT / "src" / "leaktrace"

BPF = "loads BPF programs or reads their maps: root and a kernel with BPF (tests/integration)"
# module -> why no unit test imports it (the integration tests that hold it)
NOT_UNIT_TESTED = {
    "leaktrace.commands.heap": "freezes a live process with ptrace and walks its heap (test_heap_walk.py)",
    "leaktrace.platform.module_files": "opens modules through /proc/PID/map_files, which only root may",
    "leaktrace.platform.remote_call": "calls into a live process it holds with ptrace (test_preload_attach.py)",
    "leaktrace.platform.system": "bpf() and tracefs: root (every integration test checks the system through it)",
    "leaktrace.sources.bpf.engine": BPF,
    "leaktrace.sources.bpf.image_holds": BPF,
    "leaktrace.sources.bpf.inheritance": BPF,
    "leaktrace.sources.bpf.kernel_state": BPF,
    "leaktrace.sources.bpf.maps": BPF,
    "leaktrace.sources.bpf.process_registry": BPF,
    "leaktrace.sources.bpf.stop_owners": BPF + "; its map is pinned in bpffs",
    "leaktrace.sources.bpf.trace": BPF,
    "leaktrace.sources.bpf.unwind_upload": BPF,
    "leaktrace.sources.preload.inject": "puts the library into a live process with ptrace (test_preload_attach.py)",
    "leaktrace.sources.preload.trace": "reads a target's files and table with its rights (setfsuid: root)",
}


def package_modules() -> set[str]:
    """Every module under src/leaktrace; a package only when its __init__ holds more than a docstring."""
    modules = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            body = ast.parse(path.read_text()).body
            if all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body):
                continue
            parts = parts[:-1]
        modules.add(".".join(parts))
    return modules


def imported_by_unit_tests() -> set[str]:
    """The modules (and module.name) the unit tests import, and those they name as strings."""
    named = set()
    for path in (ROOT / "tests" / "unit").rglob("*.py"):
        if path.name == Path(__file__).name:
            continue  # its list names modules; it imports none
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                named.add(node.module)
                named.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                named.update(alias.name for alias in node.names)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("leaktrace."):
                named.add(node.value)
    return named


def test_every_module_is_unit_tested_or_listed_with_its_reason():
    modules, imported = package_modules(), imported_by_unit_tests()
    assert set(NOT_UNIT_TESTED) <= modules, "listed but not a module: " + ", ".join(set(NOT_UNIT_TESTED) - modules)
    untested = sorted(modules - imported - set(NOT_UNIT_TESTED))
    assert not untested, "no unit test imports these; test them or list them with the reason: " + ", ".join(untested)
    stale = sorted(set(NOT_UNIT_TESTED) & imported)
    assert not stale, "listed, yet a unit test imports them: " + ", ".join(stale)
