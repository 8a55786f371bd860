"""Suppression files of valgrind's and LeakSanitizer's formats: parsing and matching."""

from __future__ import annotations

import pytest

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
    assert all(s.matches(LeakKind.DEFINITE, STACK) for s in found)
    assert not parse_suppressions("leak:^mai$\n", "lsan")[0].matches(LeakKind.DEFINITE, STACK)


@pytest.mark.parametrize(
    "text, message",
    [
        ("{\n name\n Memcheck:Leak\n fn:x\n}\n", "v:1: 'fn:x' is not fun:, obj:, src: or '...'"),
        ("{\n name\n Memcheck:Leak\n fun:x\n", "v:1: a suppression without its closing '}'"),
        ("fun:x\n", "v:1: a suppression starts with '{', not 'fun:x'"),
        ("{\n name\n}\n", "v:1: a suppression needs a name and a kind"),
        ("{\n n\n Memcheck:Leak\n match-leak-kinds: lost\n}\n", "v:1: match-leak-kinds: 'lost' is not"),
    ],
)
def test_malformed_files_say_where(text, message):
    with pytest.raises(UsageError, match=f"^{message}".replace("(", r"\(").replace(")", r"\)").replace("{", r"\{")):
        parse_suppressions(text, "v")


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
