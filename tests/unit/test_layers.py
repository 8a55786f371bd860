"""The folders are layers: data flows source -> snapshot -> symbolize -> render, so no
output imports a source (or the reachability check, which reads processes), no source
imports an output, and the plain data in model/ imports nothing else of leaktrace; no ring
of folders imports itself. C's #includes are held to the same layers: the layouts both
engines share live in abi/, which includes nothing of another folder."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest
from preload_library import INCLUDES, LIBRARY_SOURCES

PACKAGE = Path(__file__).parents[2] / "src" / "leaktrace"
# layer -> layers it may not import
FORBIDDEN = {
    "model": ("sources", "reachability", "analysis", "outputs", "android", "commands", "platform", "interpreters"),
    "outputs": ("sources", "reachability", "commands"),
    "android": ("sources", "reachability", "outputs", "commands"),
    "analysis": ("sources", "reachability", "outputs", "commands"),
    "sources": ("outputs", "commands"),
    "reachability": ("sources", "outputs", "commands"),  # sources call the check, never the other way
    "platform": ("sources", "reachability", "analysis", "outputs", "android", "commands", "allocators", "interpreters"),
    "allocators": ("sources", "reachability", "analysis", "outputs", "android", "commands", "model"),
    "unwind": ("sources", "reachability", "analysis", "outputs", "android", "commands", "model", "allocators"),
    "interpreters": ("sources", "reachability", "analysis", "outputs", "android", "commands", "allocators", "unwind"),
    "abi": (
        "model",
        "sources",
        "reachability",
        "analysis",
        "outputs",
        "android",
        "commands",
        "platform",
        "allocators",
        "unwind",
        "interpreters",
    ),
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


# A header by its name: each folder holding headers is on the include path, and no two share a name.
HEADER_HOMES = {path.name: path for path in PACKAGE.rglob("*.h")}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
C_FILES = sorted(
    p for p in PACKAGE.rglob("*") if p.suffix in (".c", ".h") and p.relative_to(PACKAGE).parts[0] in FORBIDDEN
)


def included_folders(path: Path) -> set[str]:
    """The folders of the leaktrace headers a C file includes."""
    names = [Path(name).name for name in INCLUDE.findall(path.read_text())]
    return {HEADER_HOMES[name].relative_to(PACKAGE).parts[0] for name in names if name in HEADER_HOMES}


def test_every_header_has_a_name_of_its_own():
    assert len(HEADER_HOMES) == len(list(PACKAGE.rglob("*.h"))) > 10


@pytest.mark.parametrize("path", C_FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_c_file_includes_a_layer_it_may_not(path):
    layer = path.relative_to(PACKAGE).parts[0]
    wrong = included_folders(path) & set(FORBIDDEN[layer])
    assert not wrong, f"{layer}/ may not include from {sorted(wrong)}"


# The program-facing malloc family: a part may hand back through it what the program's allocator
# made (frame_names.c frees what C++'s demangler allocated), the one call that goes up.
PROGRAM_API = {"malloc", "calloc", "realloc", "free"}


def library_calls(built: Path) -> dict[str, set[str]]:
    """The preload library's files -> the files whose functions or data each uses (by nm)."""
    defined, used = {}, {}
    for source in LIBRARY_SOURCES:
        objects = built / f"{source.stem}.o"
        subprocess.run(["gcc", "-c", "-O2", *(f"-I{d}" for d in INCLUDES), "-o", objects, source], check=True)
        for line in subprocess.run(["nm", objects], capture_output=True, text=True, check=True).stdout.splitlines():
            words = line.split()
            if len(words) == 3 and words[1] in "TDBRC":
                defined[words[2]] = source.stem
            elif words[:1] == ["U"]:
                used.setdefault(source.stem, set()).add(words[1])
    return {
        part: {defined[name] for name in names if name in defined and name not in PROGRAM_API} - {part}
        for part, names in used.items()
    }


def test_the_librarys_parts_call_one_another_without_a_cycle(tmp_path):
    """Each part of the preload library calls only parts below it: malloc_debug.c, the entry
    points, on top; library.h's state at the bottom; one header a part."""
    calls = library_calls(tmp_path)
    assert calls["malloc_debug"] >= {"table", "blocks", "reports"} and not calls.get("own_memory")
    left = set(calls) | {callee for callees in calls.values() for callee in callees}
    while left:
        ready = {part for part in left if not (calls.get(part, set()) & left)}
        assert ready, f"a cycle among { ({part: sorted(calls.get(part, set()) & left) for part in sorted(left)}) }"
        left -= ready


def test_intra_package_imports_are_absolute():
    relative = [
        f"{p.relative_to(PACKAGE)}:{node.lineno}"
        for p in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level and "commands" not in p.parts
    ]
    assert not relative


def folder_imports() -> dict[str, set[str]]:
    """Folder -> the other folders its modules import, or its C files include."""
    edges: dict[str, set[str]] = {}
    for path in C_FILES:
        layer = path.relative_to(PACKAGE).parts[0]
        edges.setdefault(layer, set()).update(included_folders(path) - {layer})
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).parts
        if len(parts) < 2:
            continue
        for module in imported_modules(path):
            target = module.split(".")[1] if len(module.split(".")) > 1 else None
            if target and target != parts[0] and (PACKAGE / target).is_dir():
                edges.setdefault(parts[0], set()).add(target)
    return edges


def test_the_folders_import_one_another_without_a_cycle():
    """Not two folders importing each other, nor any longer ring: the folders can be ordered."""
    edges, order, left = folder_imports(), [], set(folder_imports())
    left |= {target for targets in edges.values() for target in targets}
    while left:
        ready = sorted(f for f in left if not (edges.get(f, set()) & left))
        assert ready, (
            f"a cycle among {sorted(left)}: { ({f: sorted(edges.get(f, set()) & left) for f in sorted(left)}) }"
        )
        order += ready
        left -= set(ready)


DECLARING_BASES = {"NamedTuple", "Protocol", "TypedDict", "Structure"}  # classes whose annotations are their fields


def bare_annotations(node: ast.ClassDef) -> list[str]:
    """Names a class declares by annotation alone (state some other class must set), where it is
    not a dataclass or a class whose annotations are its fields."""
    bases = {ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases}
    if bases & DECLARING_BASES or any("dataclass" in ast.unparse(d) for d in node.decorator_list):
        return []
    return [
        item.target.id
        for item in node.body
        if isinstance(item, ast.AnnAssign) and item.value is None and isinstance(item.target, ast.Name)
    ]


def test_no_class_holds_state_declared_by_annotations_alone():
    """A mixin whose state its host declares and sets is a part in disguise: parts own their state."""
    found = [
        f"{path.relative_to(PACKAGE)}:{node.name} {names}"
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and (names := bare_annotations(node))
    ]
    assert not found


# CPython's own symbols (its C API, its eval loop), and the names of its layouts and walks here.
CPYTHON_NAMES = re.compile(
    r"\bPy[A-Z_][A-Za-z_]*|\b_Py[A-Z]\w*|interpreters[./]python|python_offsets|PythonOffsets|python_procs"
    r"|python_walk|python_stack|\bPYTHON_FRAME|python_frames\.h|\bEVAL_\w+|co_linetable"
)
OUTSIDE_INTERPRETERS = sorted(
    p
    for p in PACKAGE.rglob("*")
    if p.suffix in (".py", ".c", ".h") and p.relative_to(PACKAGE).parts[0] != "interpreters" and p.is_file()
)


def test_no_module_outside_interpreters_names_a_cpython_symbol_or_layout():
    """Interpreters sit behind interpreters/interface.py: the engines, the symbolizer and the
    outputs loop over INTERPRETERS and never look behind it."""
    assert OUTSIDE_INTERPRETERS
    named = [
        f"{path.relative_to(PACKAGE)}:{number}: {match.group(0)}"
        for path in OUTSIDE_INTERPRETERS
        for number, line in enumerate(path.read_text().splitlines(), 1)
        for match in [CPYTHON_NAMES.search(line)]
        if match
    ]
    assert not named, named
