"""Writes the Python side of the layouts C and Python share: abi/layout.py from abi/layout.h
(what leaktrace.bpf.c and user space share), unwind/rows.py from unwind/rows.h (the unwinder's
rows and mappings), abi/record.py from abi/record.h (the preload library's table records) and
each interpreter's layout.py from its frame words' header (interpreters/*/*_frames.h):

    python -m leaktrace.abi.layout_gen

The headers are the one source of truth; tests/unit/test_layouts.py fails when a generated
file is stale.
It reads only what layout.h is kept to: `#define NAME NUMBER`, enums, and structs whose
fields are u8/s16/u16/u32/s32/u64 (or the C names of those), pointers, char[N] and structs
defined above them in the same header.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

ABI = Path(__file__).parent
# header -> the Python module written from it
UNWIND = ABI.parent / "unwind"
LAYOUTS = {
    ABI / "layout.h": ABI / "layout.py",
    UNWIND / "rows.h": UNWIND / "rows.py",
    ABI / "record.h": ABI / "record.py",
    **{header: header.parent / "layout.py" for header in sorted((ABI.parent / "interpreters").glob("*/*_frames.h"))},
}
# C type -> struct format character (native sizes and alignment: x86-64)
TYPES = {
    "u8": "B",
    "uint8_t": "B",
    "s16": "h",
    "int16_t": "h",
    "u16": "H",
    "uint16_t": "H",
    "u32": "I",
    "uint32_t": "I",
    "s32": "i",
    "int32_t": "i",
    "u64": "Q",
    "uint64_t": "Q",
    "s64": "q",
    "int64_t": "q",
    "uintptr_t": "Q",
    "size_t": "Q",
    "pointer": "Q",
}
_DEFINE = re.compile(r"^#define ([A-Z][A-Z0-9_]*) (0x[0-9a-fA-F]+|\d+)[uUlL]*\b", re.M)
_ENUM = re.compile(r"^enum (\w+) \{\n(.*?)^\};", re.M | re.S)
_STRUCT = re.compile(r"^struct (\w+) \{\n(.*?)^\};", re.M | re.S)
_FIELD = re.compile(r"^\s*(?:const\s+)?(?:struct\s+)?(\w+)\s*(\*{0,2})\s*(\w+)(?:\[(\d+)\])?;")


def struct_format(body: str, inner: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """A struct's little-endian format, with its padding spelled out, and its field names
    (inner: the formats of structs it may hold, by name)."""
    fmt, names, offset, alignment = "<", [], 0, 1
    for line in body.splitlines():
        found = _FIELD.match(line)
        if not found:
            continue
        ctype, pointer, name, count = found.groups()
        if ctype == "char" and count:
            code, size, align = f"{count}s", int(count), 1
        elif inner and ctype in inner and not pointer and not count:
            code = inner[ctype][1:]
            size, align = (
                struct.calcsize(inner[ctype]),
                max(struct.calcsize(c) for c in code if c.isalpha() and c != "x"),
            )
        else:
            code = TYPES["pointer" if pointer else ctype]
            size = align = struct.calcsize(code)
            if count:
                code, size = f"{count}{code}", size * int(count)
        padding = -offset % align
        fmt += "x" * padding + code
        offset += padding + size
        alignment = max(alignment, align)
        names.append(name)
    return fmt + "x" * (-offset % alignment), names


def struct_body(header: str, name: str) -> str:
    """The fields of the struct name in a header's text."""
    return next(body for found, body in _STRUCT.findall(header) if found == name)


def python_layout(header: str, source: str) -> str:
    lines = [
        f"# Generated from {source} by abi/layout_gen.py; tests/unit/test_layouts.py checks it.",
        "import struct",
        "",
    ]
    for name, value in _DEFINE.findall(header):
        if name.isupper() and not name.endswith("_H"):
            lines.append(f"{name} = {value}")
    for enum, body in _ENUM.findall(header):
        members = re.findall(r"^[ \t]*([A-Z][A-Z0-9_]*),[ \t]*(?://[ \t]*(\w+):)?", body, re.M)
        lines.append("")
        for index, (member, _) in enumerate(members):
            lines.append(f"{member} = {index}")
        fields = tuple(field for _, field in members if field)
        if fields:
            lines.append(f"{enum.upper()}_FIELDS = (   # the Python names, in the enum's order")
            lines += [f"    {field!r}," for field in fields] + [")"]
    formats: dict[str, str] = {}
    for name, body in _STRUCT.findall(header):
        fmt, names = struct_format(body, formats)
        formats[name] = fmt
        lines += ["", f"{name.upper()} = struct.Struct({fmt!r})   # {', '.join(names)}"]
    return "\n".join(lines) + "\n"


def generated(header: Path) -> str:
    return python_layout(header.read_text(), str(header.relative_to(ABI.parent)))


def main() -> None:
    for header, module in LAYOUTS.items():
        module.write_text(generated(header))


if __name__ == "__main__":
    main()
