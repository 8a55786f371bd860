"""The folders are layers: data flows source -> snapshot -> symbolize -> render, so no
output imports a source (or the reachability check, which reads processes), no source
imports an output, and the plain data in model/ imports nothing else of leaktrace."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[2] / "src" / "leaktrace"
# layer -> layers it may not import
FORBIDDEN = {
    "model": ("sources", "reachability", "analysis", "outputs", "android", "commands", "platform"),
    "outputs": ("sources", "reachability", "commands"),
    "android": ("sources", "reachability", "outputs", "commands"),
    "analysis": ("sources", "reachability", "outputs", "commands"),
    "sources": ("outputs", "commands"),
    "reachability": ("sources", "outputs", "commands"),  # sources call the check, never the other way
    "platform": ("sources", "reachability", "analysis", "outputs", "android", "commands", "allocators"),
    "allocators": ("sources", "reachability", "analysis", "outputs", "android", "commands", "model"),
    "unwind": ("sources", "reachability", "analysis", "outputs", "android", "commands", "model", "allocators"),
}


def imported_modules(path: Path) -> set[str]:
    """Every leaktrace module a file imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("leaktrace"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("leaktrace"))
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] in FORBIDDEN)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_a_layer_it_may_not(path):
    layer = path.relative_to(PACKAGE).parts[0]
    wrong = {m for m in imported_modules(path) if m.split(".")[1:2] and m.split(".")[1] in FORBIDDEN[layer]}
    assert not wrong, f"{layer}/ may not import {sorted(wrong)}"


def test_intra_package_imports_are_absolute():
    relative = [
        f"{p.relative_to(PACKAGE)}:{node.lineno}"
        for p in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level and "commands" not in p.parts
    ]
    assert not relative


def test_no_two_folders_import_each_other():
    edges = {
        (path.relative_to(PACKAGE).parts[0], module.split(".")[1])
        for path in PACKAGE.rglob("*.py")
        if len(path.relative_to(PACKAGE).parts) > 1
        for module in imported_modules(path)
        if len(module.split(".")) > 1 and (PACKAGE / module.split(".")[1]).is_dir()
    }
    both_ways = sorted((a, b) for a, b in edges if a < b and (b, a) in edges)
    assert not both_ways, both_ways
