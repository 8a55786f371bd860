"""Writes allocators.h, the allocators package as the preload library reads it: the functions it
defines in the allocator's place and an attach patches in (an X-macro list). The library finds
the rest of an allocator (its usable-size function) in the object that defines its malloc.
tests/unit/test_layouts.py fails when the header is stale; regenerate with

    python -m leaktrace.allocators.c_header
"""

from __future__ import annotations

from pathlib import Path

from leaktrace.allocators import ALLOCATING, FREE

HEADER = Path(__file__).with_name("allocators.h")


def _continued(lines: list[str]) -> list[str]:
    """One macro over several lines, its backslashes in column 120 as clang-format puts them."""
    return [line.ljust(119) + "\\" for line in lines[:-1]] + lines[-1:]


def generated() -> str:
    names = [function.name for function in (*ALLOCATING, FREE)]
    lines = [
        "// Generated from allocators/__init__.py by allocators/c_header.py; tests/unit/test_layouts.py checks it.",
        "#ifndef LEAKTRACE_ALLOCATORS_H",
        "#define LEAKTRACE_ALLOCATORS_H",
        "",
        "// The allocator's entry points the library defines and an attach puts in every module's GOT.",
        *_continued(["#define ALLOCATOR_FUNCTIONS(X)", *(f"    X({name})" for name in names)]),
        "",
        "#endif",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    HEADER.write_text(generated())


if __name__ == "__main__":
    main()
