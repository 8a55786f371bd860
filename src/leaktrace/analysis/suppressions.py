"""Leak suppressions in the two formats teams keep, matched against a loss record's frames.

valgrind's: blocks of `{ NAME / Memcheck:Leak / [match-leak-kinds: K,...] / FRAME... }`,
each FRAME `fun:PATTERN`, `obj:PATTERN`, `src:FILE[:LINE]` (`*` and `?` wildcards) or
`...` (any number of frames), matched from the innermost frame on. valgrind's innermost
frame is the allocator's entry (malloc, operator new), which leaktrace's stacks start
below: it stands as a frame of its own here, and leaktrace's own frames of those
functions (an inlined calloc, libstdc++'s operator new) are left out.
valgrind starts threads with clone (it refuses clone3): `fun:clone` matches clone3 too.
LeakSanitizer's: `leak:PATTERN` lines, matched against every frame's function, module and
source file (a substring; `*` any text; `^` and `$` anchor it).

A file is opened as platform/named_files.py says (no link another user could have made, a
regular file) and read up to SUPPRESSION_FILE_LIMIT; a larger one is refused, and an error
names a line by its position, never by what it says. Matching a stack takes time in
proportion to its frames times the suppression's lines, however many `...` lines it has.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from leaktrace.errors import RuntimeFailure, UsageError
from leaktrace.model.snapshot import LeakCheck, LeakKind, SuppressionUse
from leaktrace.platform.named_files import RefusedName, open_named_file
from leaktrace.platform.target_files import read_bounded

if TYPE_CHECKING:
    from leaktrace.analysis.symbolize import Frame, SymbolizedSnapshot

DEFAULT_SUPPRESSIONS = os.path.join(os.path.dirname(__file__), "default.supp")
SUPPRESSION_FILE_LIMIT = 4 << 20  # bytes read of a suppression file
# The allocator entry points valgrind's stacks start with (its own replacements).
ALLOCATOR_ENTRIES = (
    "malloc",
    "calloc",
    "realloc",
    "reallocarray",
    "memalign",
    "posix_memalign",
    "aligned_alloc",
    "valloc",
    "pvalloc",
    "_Znwm",
    "_Znam",
    "_ZnwmRKSt9nothrow_t",
    "_ZnamRKSt9nothrow_t",
    "_ZnwmSt11align_val_t",
    "_ZnamSt11align_val_t",
    "operator new(unsigned long)",
    "operator new[](unsigned long)",
)
VALGRIND_PRELOAD = "/usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so"
KIND_WORDS = {kind.value: kind for kind in LeakKind}  # valgrind's words: definite, indirect, ...


def leak_kinds(text: str, option: str) -> frozenset[LeakKind]:
    """valgrind's list of kinds: definite,indirect,possible,reachable, or all, or none."""
    words = [word.strip() for word in text.split(",") if word.strip()]
    if words == ["all"]:
        return frozenset(LeakKind)
    if words == ["none"]:
        return frozenset()
    unknown = [word for word in words if word not in KIND_WORDS]
    if unknown or not words:
        raise UsageError(
            f"{option}: '{text.strip()}' is not a list of definite, indirect, possible, reachable (or all, none)"
        )
    return frozenset(KIND_WORDS[word] for word in words)


def _wildcard(pattern: str, text: str) -> bool:
    """valgrind's match: `*` any text, `?` one character, nothing else special."""
    return fnmatch.fnmatchcase(text, pattern.replace("[", "[[]"))


def _is_allocator_entry(name: str | None) -> bool:
    return name is not None and (name in ALLOCATOR_ENTRIES or name.startswith("operator new"))


@dataclass(frozen=True)
class Suppression:
    name: str
    source: str  # file:line where it starts
    kinds: frozenset[LeakKind]  # the kinds it applies to
    frames: tuple[tuple[str, str], ...] = ()  # valgrind's: (fun|obj|src|..., pattern)
    pattern: re.Pattern | None = None  # LeakSanitizer's

    def matches(self, kind: LeakKind, frames: list[Frame]) -> bool:
        if kind not in self.kinds:
            return False
        if self.pattern is not None:
            return any(
                self.pattern.search(text)
                for frame in frames
                for text in (frame.function, frame.module, frame.file)
                if text
            )
        return self._matches_stack(_below_allocator(frames))

    def _matches_stack(self, frames: list[Frame | None]) -> bool:
        """Whether self.frames match the stack from its innermost frame on (None: the
        allocator's entry), the stack's outer frames past the last line free: the set of
        lines reached is carried one frame at a time, as an automaton without backtracking."""
        lines = self.frames

        def closure(reached: set[int]) -> set[int]:
            for line in sorted(reached):  # a `...` also lets the line after it start here
                while line < len(lines) and lines[line][0] == "...":
                    line += 1
                    reached.add(line)
            return reached

        reached = closure({0})
        for frame in frames:
            if len(lines) in reached:
                return True
            reached = closure(
                {line for line in reached if line < len(lines) and lines[line][0] == "..."}
                | {
                    line + 1
                    for line in reached
                    if line < len(lines) and lines[line][0] != "..." and _frame_matches(*lines[line], frame)
                }
            )
            if not reached:
                return False
        return len(lines) in reached


def _below_allocator(frames: list[Frame]) -> list[Frame | None]:
    """The stack as valgrind has it: the allocator's entry (None), then the caller's frames."""
    first = 0
    while first < len(frames) and _is_allocator_entry(frames[first].function):
        first += 1
    return [None, *frames[first:]]


def _frame_matches(what: str, pattern: str, frame: Frame | None) -> bool:
    if frame is None:  # the allocator's entry
        if what == "fun":
            return any(_wildcard(pattern, name) for name in ALLOCATOR_ENTRIES)
        return what == "obj" and _wildcard(pattern, VALGRIND_PRELOAD)
    if what == "fun":
        # valgrind refuses clone3, so its threads start in clone: the same frame.
        names = (frame.function, "clone") if frame.function == "clone3" else (frame.function or "???",)
        return any(_wildcard(pattern, name) for name in names)
    if what == "obj":
        return _wildcard(pattern, frame.module or "???")
    file, _, line = pattern.partition(":")
    return (
        bool(frame.file)
        and _wildcard(file, os.path.basename(frame.file or ""))
        and (not line or str(frame.line) == line)
    )


def _lsan_pattern(text: str) -> re.Pattern:
    start, end = text.startswith("^"), text.endswith("$")
    body = text[1 if start else 0 : len(text) - 1 if end else len(text)]
    regex = ".*".join(re.escape(part) for part in body.split("*"))
    return re.compile(("^" if start else "") + regex + ("$" if end else ""))


def parse_suppressions(text: str, path: str) -> list[Suppression]:
    """Every leak suppression of a file of either format; other tools' entries (Memcheck:Cond,
    Helgrind:..., LeakSanitizer's race: and the like) are skipped. UsageError on a malformed one."""
    lines = [line.strip() for line in text.splitlines()]
    found: list[Suppression] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line or line.startswith("#"):
            i += 1
            continue
        if line.startswith("leak:"):
            pattern = line[len("leak:") :].strip()
            if pattern:
                found.append(Suppression(line, f"{path}:{i + 1}", frozenset(LeakKind), pattern=_lsan_pattern(pattern)))
            i += 1
            continue
        other = re.match(r"^([a-z_]+):", line)
        if other and other.group(1) not in ("fun", "obj", "src"):  # another sanitizer's kind of entry
            i += 1
            continue
        if line != "{":
            raise UsageError(f"{path}:{i + 1}: not a suppression (one starts with a line of '{{')")
        start = i
        try:
            end = lines.index("}", i)
        except ValueError:
            raise UsageError(f"{path}:{i + 1}: a suppression without its closing '}}'") from None
        body = [entry for entry in lines[i + 1 : end] if entry and not entry.startswith("#")]
        i = end + 1
        if len(body) < 2:
            raise UsageError(f"{path}:{start + 1}: a suppression needs a name and a kind")
        name, tool, rest = body[0], body[1], body[2:]
        if tool != "Memcheck:Leak":
            continue
        kinds = frozenset(LeakKind)
        if rest and rest[0].startswith("match-leak-kinds:"):
            try:
                kinds = leak_kinds(rest[0].split(":", 1)[1], "match-leak-kinds")
            except UsageError:
                raise UsageError(
                    f"{path}:{start + 1}: match-leak-kinds is not a list of definite, indirect, possible, reachable"
                ) from None
            rest = rest[1:]
        frames = []
        for entry in rest:
            if entry == "...":
                frames.append(("...", ""))
                continue
            what, colon, pattern = entry.partition(":")
            if not colon or what not in ("fun", "obj", "src"):
                raise UsageError(f"{path}:{start + 1}: a frame line that is not fun:, obj:, src: or '...'")
            frames.append((what, pattern.strip()))
        found.append(Suppression(name, f"{path}:{start + 1}", kinds, tuple(frames)))
    return found


def read_suppressions(paths: Iterable[str]) -> list[Suppression]:
    """The suppressions of each file, in order (UsageError, in one line, for one that cannot be read)."""
    found = []
    for path in paths:
        try:
            fd = open_named_file(path)
            try:
                data = read_bounded(fd, SUPPRESSION_FILE_LIMIT, f"suppressions {path}")
            finally:
                os.close(fd)
        except OSError as e:
            raise UsageError(f"cannot read suppressions {path}: {e.strerror}") from None
        except RuntimeFailure as e:
            raise UsageError(f"cannot read suppressions {e}" if isinstance(e, RefusedName) else str(e)) from None
        found += parse_suppressions(data.decode("utf-8", errors="replace"), path)
    return found


def suppression_text(kind: LeakKind, frames: list[Frame]) -> str:
    """A valgrind suppression for a loss record, as --gen-suppressions prints it, that valgrind
    accepts too: the allocator's entry as `fun:*`, then a frame per line down to main (valgrind
    shows nothing below it), a thread's clone3 as `fun:clone*` (valgrind's threads use clone)."""
    lines = ["{", "   <insert_a_suppression_name_here>", "   Memcheck:Leak", f"   match-leak-kinds: {kind.value}"]
    lines.append("   fun:*")
    for frame in _below_allocator(frames)[1:]:
        if frame is None:
            continue
        name = "clone*" if frame.function == "clone3" else frame.function
        lines.append(f"   fun:{name}" if name else f"   obj:{frame.module or '*'}")
        if name == "main":
            break
    return "\n".join(lines + ["}"]) + "\n"


@dataclass(frozen=True)
class LeakCheckSettings:
    """What --leak-check reports and what fails the run (valgrind's options and defaults)."""

    summary_only: bool = False  # --leak-check=summary: the totals, no record
    shown: frozenset[LeakKind] = frozenset({LeakKind.DEFINITE, LeakKind.POSSIBLE})
    errors_for: frozenset[LeakKind] = frozenset({LeakKind.DEFINITE, LeakKind.POSSIBLE})
    error_exitcode: int | None = None
    suppressions: tuple[Suppression, ...] = ()
    generate: bool = False  # --gen-suppressions


def apply_suppressions(
    check: LeakCheck, symbolized: SymbolizedSnapshot, suppressions: Iterable[Suppression]
) -> LeakCheck:
    """The check with each record the first matching suppression names marked, and what each
    suppression matched."""
    suppressions = list(suppressions)
    used: dict[int, list[int]] = {}
    records = []
    for record in check.records:
        frames = symbolized.stack_of(record)
        index = next((i for i, s in enumerate(suppressions) if s.matches(record.kind, frames)), None)
        if index is not None:
            totals = used.setdefault(index, [0, 0])
            totals[0] += record.blocks
            totals[1] += record.bytes
            record = dataclasses.replace(record, suppressed_by=suppressions[index].name)
        records.append(record)
    return dataclasses.replace(
        check,
        records=tuple(records),
        suppressions_used=tuple(
            SuppressionUse(suppressions[i].name, suppressions[i].source, blocks, size)
            for i, (blocks, size) in sorted(used.items())
        ),
    )
