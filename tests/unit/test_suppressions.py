"""Suppression files of valgrind's and LeakSanitizer's formats: parsing and matching."""

from __future__ import annotations

import random

import pytest
from each import each

from leaktrace.analysis.suppressions import leak_kinds, parse_suppressions, suppression_text
from leaktrace.analysis.symbolize import Frame
from leaktrace.errors import UsageError
from leaktrace.model.snapshot import LeakKind

STACK = [
    Frame(0x1000, "make", 0x18, "/srv/app", "app.c", 25),
    Frame(0x1100, "lost_list", 0x13, "/srv/app", "app.c", 40),
    Frame(0x1200, "main", 0x4F, "/srv/app", "app.c", 76),
    Frame(0x2000, "__libc_start_call_main", 0x7A, "/usr/lib/x86_64-linux-gnu/libc.so.6"),
]
VALGRIND = """
# a comment
{
   exact
   Memcheck:Leak
   match-leak-kinds: definite
   fun:malloc
   fun:make
   fun:lost_list
   fun:main
}
{
   wildcards
   Memcheck:Leak
   fun:*alloc
   ...
   fun:ma?n
}
{
   objects
   Memcheck:Leak
   match-leak-kinds: reachable,possible
   obj:/usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so
   obj:/srv/*
}
{
   not a leak
   Memcheck:Cond
   fun:whatever
}
"""


def named(suppressions):
    return {s.name: s for s in suppressions}


def test_valgrind_blocks_are_read_and_other_tools_skipped():
    found = named(parse_suppressions(VALGRIND, "v.supp"))
    assert set(found) == {"exact", "wildcards", "objects"}
    assert found["exact"].kinds == {LeakKind.DEFINITE} and found["exact"].source == "v.supp:3"
    assert found["wildcards"].kinds == frozenset(LeakKind)


def test_valgrind_matching_from_the_allocators_entry():
    found = named(parse_suppressions(VALGRIND, "v.supp"))
    assert found["exact"].matches(LeakKind.DEFINITE, STACK)
    assert not found["exact"].matches(LeakKind.INDIRECT, STACK)  # match-leak-kinds
    assert found["wildcards"].matches(LeakKind.INDIRECT, STACK)  # *alloc, then ... down to main
    assert found["objects"].matches(LeakKind.POSSIBLE, STACK)
    assert not found["objects"].matches(LeakKind.DEFINITE, STACK)
    # A suppression longer than the stack does not match; nor a different frame.
    longer = parse_suppressions("{\n x\n Memcheck:Leak\n fun:malloc\n fun:make\n fun:main\n}\n", "l")
    assert not longer[0].matches(LeakKind.DEFINITE, STACK)


def test_leaktraces_own_allocator_frames_stand_for_valgrinds_entry():
    inlined = [Frame(0x900, "calloc", 0, "/lib64/ld-linux-x86-64.so.2", inlined=True), *STACK]
    [exact] = parse_suppressions(VALGRIND, "v.supp")[:1]
    assert exact.matches(LeakKind.DEFINITE, inlined)
    thread = [Frame(1, "work"), Frame(2, "start_thread"), Frame(3, "clone3")]
    [clone] = parse_suppressions(
        "{\n t\n Memcheck:Leak\n fun:malloc\n fun:work\n fun:start_thread\n fun:clone\n}\n", "t"
    )
    assert clone.matches(LeakKind.DEFINITE, thread)


def test_leak_sanitizer_patterns():
    found = parse_suppressions("leak:lost_\nleak:^main$\nleak:app.c\nleak:libc.so*\nrace:foo\n", "lsan")
    assert [s.name for s in found] == ["leak:lost_", "leak:^main$", "leak:app.c", "leak:libc.so*"]
    assert all(s.matches(LeakKind.DEFINITE, STACK) for s in each(found))
    assert not parse_suppressions("leak:^mai$\n", "lsan")[0].matches(LeakKind.DEFINITE, STACK)


@pytest.mark.parametrize(
    "text, message",
    [
        ("{\n name\n Memcheck:Leak\n fn:x\n}\n", "v:1: a frame line that is not fun:, obj:, src: or '...'"),
        ("{\n name\n Memcheck:Leak\n fun:x\n", "v:1: a suppression without its closing '}'"),
        ("fun:x\n", "v:1: not a suppression (one starts with a line of '{')"),
        ("{\n name\n}\n", "v:1: a suppression needs a name and a kind"),
        ("{\n n\n Memcheck:Leak\n match-leak-kinds: lost\n}\n", "v:1: match-leak-kinds is not a list"),
    ],
)
def test_malformed_files_say_where(text, message):
    with pytest.raises(UsageError, match=f"^{message}".replace("(", r"\(").replace(")", r"\)").replace("{", r"\{")):
        parse_suppressions(text, "v")


@pytest.mark.parametrize(
    "text",
    [
        "Root$6$secret:19000:0:99999:7:::\n",
        "{\n n\n Memcheck:Leak\n root:$6$secret\n}\n",
        "{\n n\n Memcheck:Leak\n match-leak-kinds: $6$secret\n}\n",
    ],
)
def test_an_error_names_the_line_by_its_position_never_by_what_it_says(text):
    with pytest.raises(UsageError) as refused:
        parse_suppressions(text, "v")
    assert "secret" not in str(refused.value) and str(refused.value).startswith("v:1: ")


def reference_match(lines, frames, line=0, at=0) -> bool:
    """The backtracking definition the automaton must agree with (exponential in the `...`s)."""
    if line == len(lines):
        return True
    if lines[line] == "...":
        return any(reference_match(lines, frames, line + 1, start) for start in range(at, len(frames) + 1))
    return at < len(frames) and lines[line] == frames[at] and reference_match(lines, frames, line + 1, at + 1)


def test_matching_agrees_with_backtracking_on_seeded_patterns():
    seed = random.randrange(1 << 32)
    print(f"seed {seed}")
    chosen = random.Random(seed)
    names = ["a", "b", "c"]
    for _ in range(3000):
        stack = [chosen.choice(names) for _ in range(chosen.randrange(0, 8))]
        lines = [chosen.choice([*names, "..."]) for _ in range(chosen.randrange(0, 7))]
        text = (
            "{\n s\n Memcheck:Leak\n fun:malloc\n"
            + "".join(" ...\n" if line == "..." else f" fun:{line}\n" for line in lines)
            + "}\n"
        )
        [suppression] = parse_suppressions(text, "r")
        frames = [Frame(0x1000 + i, name, 0, "/srv/app") for i, name in enumerate(stack)]
        assert suppression.matches(LeakKind.DEFINITE, frames) == reference_match(lines, stack), (seed, lines, stack)


def test_matching_costs_frames_times_lines_however_many_dots(monkeypatch):
    """Twelve `...` lines and a stack of 200 frames that almost match: the backtracking
    matcher took 69 s; the automaton compares each line with each frame at most once."""
    import leaktrace.analysis.suppressions as suppressions

    compared = []
    real = suppressions._frame_matches
    monkeypatch.setattr(suppressions, "_frame_matches", lambda *a: compared.append(1) or real(*a))
    lines = "".join(" ...\n fun:f\n" for _ in range(12)) + " fun:never\n"
    [suppression] = parse_suppressions("{\n s\n Memcheck:Leak\n" + lines + "}\n", "d")
    stack = [Frame(0x1000 + i, "f", 0, "/srv/app") for i in range(200)]
    assert not suppression.matches(LeakKind.DEFINITE, stack)
    assert len(compared) <= (len(stack) + 1) * len(suppression.frames)


def test_kind_lists():
    assert leak_kinds("all", "x") == frozenset(LeakKind) and leak_kinds("none", "x") == frozenset()
    assert leak_kinds("definite, possible", "x") == {LeakKind.DEFINITE, LeakKind.POSSIBLE}


def test_a_generated_suppression_matches_its_own_stack_and_stops_at_main():
    text = suppression_text(LeakKind.DEFINITE, STACK)
    assert text.splitlines()[3:] == [
        "   match-leak-kinds: definite",
        "   fun:*",
        "   fun:make",
        "   fun:lost_list",
        "   fun:main",
        "}",
    ]
    [generated] = parse_suppressions(text, "g")
    assert generated.matches(LeakKind.DEFINITE, STACK)
