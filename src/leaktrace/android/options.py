"""malloc_debug option strings: Android's syntax, ranges and error texts.

One table of options serves every engine; each engine says which options it can
honour (see ``BPF_ENGINE_OPTIONS``) and refuses the rest with a reason.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from leaktrace.platform.arch import HOST

PROGRAM_NAME = "leaktrace"
PATH_MAX = 4096  # a file name's bytes, its end included (Linux)
LONG_MAX = 2**63 - 1
LONG_MIN = -(2**63)
MINIMUM_ALIGNMENT_BYTES = 16
DEFAULT_DUMP_PREFIX = "/tmp/backtrace_heap"  # Android's /data/local/tmp does not exist on Linux

USAGE_LINES = (
    "For malloc debug option descriptions go to:",
    "  https://android.googlesource.com/platform/bionic/+/main/libc/malloc_debug/README.md",
)


class OptionError(ValueError):
    """An option string malloc_debug would reject; str() is upstream's message."""


@dataclass(frozen=True)
class OptionSpec:
    name: str
    takes: str  # "flag", "int" (value optional), "size" (value required), "text"
    sets: tuple[str, ...] = ()  # fields written, in order
    default: int | str | None = None
    minimum: int = 1
    maximum: int = HOST.size_max
    aliases: tuple[str, ...] = ()


_GUARD_MAX = 16384
OPTION_SPECS: tuple[OptionSpec, ...] = (
    OptionSpec("front_guard", "int", ("front_guard_bytes",), 32, 1, _GUARD_MAX),
    OptionSpec("rear_guard", "int", ("rear_guard_bytes",), 32, 1, _GUARD_MAX),
    OptionSpec("guard", "int", ("front_guard_bytes", "rear_guard_bytes"), 32, 1, _GUARD_MAX),
    OptionSpec("backtrace", "int", ("backtrace_frames",), 16, 1, 256, ("bt",)),
    OptionSpec("backtrace_enable_on_signal", "int", ("backtrace_frames",), 16, 1, 256, ("bt_en_on_sig",)),
    OptionSpec("backtrace_dump_on_exit", "flag", aliases=("bt_dmp_on_ex",)),
    OptionSpec(
        "backtrace_dump_prefix",
        "text",
        ("backtrace_dump_prefix",),
        "/data/local/tmp/backtrace_heap",
        aliases=("bt_dmp_pre",),
    ),
    OptionSpec("backtrace_full", "flag", aliases=("bt_full",)),
    OptionSpec("backtrace_size", "size", ("backtrace_min_size", "backtrace_max_size"), aliases=("bt_sz",)),
    OptionSpec("backtrace_min_size", "size", ("backtrace_min_size",), aliases=("bt_min_sz",)),
    OptionSpec("backtrace_max_size", "size", ("backtrace_max_size",), aliases=("bt_max_sz",)),
    OptionSpec("check_unreachable_on_signal", "flag"),
    OptionSpec("fill_on_alloc", "int", ("fill_on_alloc_bytes",), HOST.size_max),
    OptionSpec("fill_on_free", "int", ("fill_on_free_bytes",), HOST.size_max),
    OptionSpec("fill", "int", ("fill_on_alloc_bytes", "fill_on_free_bytes"), HOST.size_max),
    OptionSpec("expand_alloc", "int", ("expand_alloc_bytes",), 16, 1, 16384),
    OptionSpec("free_track", "int", ("free_track_allocations",), 100, 1, 16384),
    OptionSpec("free_track_backtrace_num_frames", "int", ("free_track_backtrace_num_frames",), 16, 0, 256),
    OptionSpec("leak_track", "flag"),
    OptionSpec("log_allocator_stats_on_signal", "flag"),
    OptionSpec("log_allocator_stats_on_exit", "flag"),
    OptionSpec("record_allocs", "int", ("record_allocs_num_entries",), 8_000_000, 1, 50_000_000),
    OptionSpec("record_allocs_file", "text", ("record_allocs_file",), "/data/local/tmp/record_allocs.txt"),
    OptionSpec("record_allocs_on_exit", "flag"),
    OptionSpec("verify_pointers", "flag"),
    OptionSpec("abort_on_error", "flag"),
    OptionSpec("verbose", "flag"),
)
SPECS_BY_NAME: dict[str, OptionSpec] = {name: spec for spec in OPTION_SPECS for name in (spec.name, *spec.aliases)}

# Options that only make sense inside the allocator: a uprobe sees calls, not memory.
ALLOCATOR_ONLY = frozenset(
    {
        "front_guard",
        "rear_guard",
        "guard",
        "fill_on_alloc",
        "fill_on_free",
        "fill",
        "expand_alloc",
        "free_track",
        "free_track_backtrace_num_frames",
        "record_allocs",
        "record_allocs_file",
        "record_allocs_on_exit",
        "verify_pointers",
        "abort_on_error",
    }
)
# What the LD_PRELOAD library (sources/preload/native/*.c) honours; it refuses the rest.
PRELOAD_LIBRARY_OPTIONS = frozenset(
    {
        "backtrace",
        "backtrace_enable_on_signal",
        "backtrace_size",
        "backtrace_min_size",
        "backtrace_max_size",
        "backtrace_dump_on_exit",
        "backtrace_dump_prefix",
        "backtrace_full",
        "leak_track",
        "front_guard",
        "rear_guard",
        "guard",
        "fill_on_alloc",
        "fill_on_free",
        "fill",
        "expand_alloc",
        "free_track",
        "free_track_backtrace_num_frames",
        "verify_pointers",
        "abort_on_error",
    }
)
BPF_ENGINE_OPTIONS = frozenset(
    {
        "backtrace",
        "backtrace_size",
        "backtrace_min_size",
        "backtrace_max_size",
        "backtrace_dump_on_exit",
        "backtrace_dump_prefix",
        "backtrace_full",
        "leak_track",
    }
)


@dataclass(frozen=True)
class MallocDebugConfig:
    """The result of parsing one option string; options are canonical names."""

    options: tuple[str, ...] = ()
    values: dict[str, int | str] = field(default_factory=dict)

    @property
    def backtrace_frames(self) -> int:
        return int(self.values.get("backtrace_frames", 16))

    @property
    def backtrace_min_size(self) -> int:
        return int(self.values.get("backtrace_min_size", 0))

    @property
    def backtrace_max_size(self) -> int:
        return int(self.values.get("backtrace_max_size", HOST.size_max))


def options_header() -> str:
    """The C table of options for sources/preload/native/options.h: the same list the Python parser uses."""
    lines = [
        "// Generated by src/leaktrace/android/options.py (options_header); tests check it is current.",
        "// clang-format off",
        "#define TAKES_FLAG 0",
        "#define TAKES_INT 1",
        "#define TAKES_SIZE 2",
        "#define TAKES_TEXT 3",
        f'#define DEFAULT_DUMP_PREFIX "{DEFAULT_DUMP_PREFIX}"   /* Android\'s /data/local/tmp is not on Linux */',
        "struct option_spec { const char *name, *alias; int takes; size_t default_number, minimum, maximum; "
        "int supported; };",
        "static const struct option_spec option_specs[] = {",
    ]
    takes = {"flag": "TAKES_FLAG", "int": "TAKES_INT", "size": "TAKES_SIZE", "text": "TAKES_TEXT"}

    def c_number(value: int) -> str:
        return "SIZE_MAX" if value == HOST.size_max else str(value)

    for spec in OPTION_SPECS:
        assert len(spec.aliases) <= 1, spec.name
        alias = f'"{spec.aliases[0]}"' if spec.aliases else "NULL"
        default = spec.default if isinstance(spec.default, int) else 0
        lines.append(
            f'    {{"{spec.name}", {alias}, {takes[spec.takes]}, {c_number(default)}, {spec.minimum}, '
            f"{c_number(spec.maximum)}, {int(spec.name in PRELOAD_LIBRARY_OPTIONS)}}},"
        )
    lines.append("};")
    return "\n".join(lines) + "\n"


def _split_options(text: str) -> Iterator[tuple[str, str]]:
    """Yields (name, value) the way bionic's Config::GetOption reads them."""
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in C_SPACE:
            i += 1
        if i >= n:
            return
        start = i
        while i < n and text[i] not in C_SPACE and text[i] != "=":
            i += 1
        name = text[start:i]
        while i < n and text[i] in C_SPACE:
            i += 1
        value = ""
        if i < n and text[i] == "=":
            i += 1
            while i < n and text[i] in C_SPACE:
                i += 1
            start = i
            while i < n and text[i] not in C_SPACE:
                i += 1
            value = text[start:i]
        yield name, value


C_SPACE = " \t\n\v\f\r"  # C's isspace() in the C locale: Unicode spaces and \x1c-\x1f are not separators
LONG_DIGITS = 19  # digits of LONG_MAX: a longer number overflows whatever its value


def _strtol(value: str) -> tuple[int | None, str, bool]:
    """C strtol(value, &end, 10): (number or None, unparsed rest, overflowed)."""
    i = 0
    sign = 1
    if i < len(value) and value[i] in "+-":
        sign = -1 if value[i] == "-" else 1
        i += 1
    start = i
    while i < len(value) and value[i] in "0123456789":
        i += 1
    if i == start:
        return None, value, False
    if len(value[start:i].lstrip("0")) > LONG_DIGITS:  # no int() of it: Python limits its digits
        return 0, value[i:], True
    number = sign * int(value[start:i].lstrip("0") or "0")
    overflowed = not LONG_MIN <= number <= LONG_MAX
    return number, value[i:], overflowed


def _parse_number(name: str, value: str, minimum: int, maximum: int) -> int:
    number, rest, overflowed = _strtol(value)
    prefix = f"{PROGRAM_NAME}: bad value for option '{name}'"
    if overflowed:
        raise OptionError(f"{prefix}: {os.strerror(errno.ERANGE)}")
    if number is None:
        raise OptionError(prefix)
    if rest:
        raise OptionError(f"{prefix}, non space found after option: {rest}")
    if number < 0:
        raise OptionError(f"{prefix}, value cannot be negative: {number}")
    if number < minimum:
        raise OptionError(f"{prefix}, value must be >= {minimum}: {number}")
    if number > maximum:
        raise OptionError(f"{prefix}, value must be <= {maximum}: {number}")
    return number


def parse_malloc_debug_options(text: str) -> MallocDebugConfig:
    """Parses an option string; raises OptionError with upstream's message."""
    options: list[str] = []
    values: dict[str, int | str] = {}
    for name, value in _split_options(text):
        spec = SPECS_BY_NAME.get(name)
        if spec is None:
            raise OptionError(f"{PROGRAM_NAME}: unknown option {name}")
        if spec.takes == "flag":
            if value:
                raise OptionError(f"{PROGRAM_NAME}: value set for option '{name}' which does not take a value")
            parsed: int | str | None = None
        elif spec.takes == "text":
            if len(value.encode(errors="surrogateescape")) >= PATH_MAX:  # no file could have such a name
                raise OptionError(f"{PROGRAM_NAME}: bad value for option '{name}': {os.strerror(errno.ENAMETOOLONG)}")
            parsed = value or spec.default
        elif spec.takes == "int" and not value:
            parsed = spec.default
        else:
            parsed = _parse_number(name, value, spec.minimum, spec.maximum)
        if spec.name in ("front_guard", "guard") and isinstance(parsed, int):
            values["front_guard_bytes"] = -(-parsed // MINIMUM_ALIGNMENT_BYTES) * MINIMUM_ALIGNMENT_BYTES
            values.update({f: parsed for f in spec.sets if f != "front_guard_bytes"})
        elif parsed is not None:  # a flag sets no field
            values.update({f: parsed for f in spec.sets})
        if spec.name not in options:
            options.append(spec.name)
    return MallocDebugConfig(tuple(options), values)


def check_engine_options(config: MallocDebugConfig, engine: str = "bpf") -> None:
    """Refuses options the engine (bpf or preload) cannot honour, saying why."""
    for name in config.options:
        if engine == "bpf" and name in ALLOCATOR_ONLY:
            raise OptionError(
                f"{PROGRAM_NAME}: option '{name}' works only inside the allocator; "
                "the BPF engine sees calls, not memory"
            )
        supported = BPF_ENGINE_OPTIONS if engine == "bpf" else PRELOAD_LIBRARY_OPTIONS
        if name not in supported:
            what = "the BPF engine" if engine == "bpf" else "leaktrace's library yet"
            raise OptionError(f"{PROGRAM_NAME}: option '{name}' is not supported by {what}")
