"""The leak check in valgrind's text: loss records of the kinds shown, smallest first and
numbered as valgrind numbers them, each with its stack; suppressed records left out of the
list and counted apart in the LEAK SUMMARY; --leak-check=summary prints the totals only."""

from __future__ import annotations

import dataclasses

from leaktrace import Counters, Frame, ProcessInfo, Snapshot, SymbolizedSnapshot
from leaktrace.analysis.suppressions import LeakCheckSettings
from leaktrace.model.snapshot import LeakCheck, LeakKind, LossRecord, StackStatus, SuppressionUse
from leaktrace.outputs.leak_check import listed_records, loss_record_title, render_leak_check

FRAMES = {
    (7, 0x1010): Frame(0x1010, "make", 0x18, "/opt/t/leaks", "leaks.c", 9),
    (7, 0x2020): Frame(0x2020, "main", 0x4F, "/opt/t/leaks", "leaks.c", 76),
}
RECORDS = (
    LossRecord(7, LeakKind.REACHABLE, 2, 332, (0x2020,)),
    LossRecord(7, LeakKind.DEFINITE, 1, 48, (0x1010, 0x2020)),
    LossRecord(7, LeakKind.DEFINITE, 5, 236, (0x2020,)),
    LossRecord(7, LeakKind.POSSIBLE, 1, 200, (), StackStatus.FILTERED),
    LossRecord(7, LeakKind.INDIRECT, 3, 160, (0x1010,)),
    LossRecord(7, LeakKind.DEFINITE, 1, 288, (0x2020,), suppressed_by="glibc-tls"),
)
CHECK = LeakCheck(
    7, RECORDS, 0.003, suppressions_used=(SuppressionUse("glibc-tls", "default.supp:5", 1, 288),), command="./leaks"
)
SYMBOLIZED = SymbolizedSnapshot(Snapshot(0.0, (), Counters(), {7: ProcessInfo(7, "leaks")}), FRAMES)


def test_records_listed_are_the_kinds_shown_smallest_first_without_the_suppressed():
    listed = listed_records(CHECK, LeakCheckSettings())
    assert [(r.kind, r.bytes) for r in listed] == [
        (LeakKind.DEFINITE, 48),
        (LeakKind.POSSIBLE, 200),
        (LeakKind.DEFINITE, 236),
    ]
    every = LeakCheckSettings(shown=frozenset(LeakKind))
    assert [r.bytes for r in listed_records(CHECK, every)] == [48, 160, 200, 236, 332]


def test_titles_read_as_valgrind_s():
    record = LossRecord(1, LeakKind.INDIRECT, 1234, 5_000_000)
    assert loss_record_title(record, 2, 9) == (
        "5,000,000 bytes in 1,234 blocks are indirectly lost in loss record 2 of 9"
    )


def test_the_text_lists_each_record_with_its_stack_then_the_summary():
    text = render_leak_check(SYMBOLIZED, CHECK, LeakCheckSettings())
    lines = text.splitlines()
    assert lines[0] == "leak check of pid 7 (./leaks) (valgrind's kinds; it stood still 3.0 ms):"
    assert lines[1] == "48 bytes in 1 blocks are definitely lost in loss record 1 of 3"
    assert lines[2].startswith("   at make+0x18") and lines[3].startswith("   by main+0x4f")
    assert "200 bytes in 1 blocks are possibly lost in loss record 2 of 3" in lines
    assert "   (no stack: filtered)" in lines
    summary = lines[lines.index("LEAK SUMMARY:") + 1 :]
    assert summary == [
        "   definitely lost: 284 bytes in 6 blocks",
        "   indirectly lost: 160 bytes in 3 blocks",
        "     possibly lost: 200 bytes in 1 blocks",
        "   still reachable: 332 bytes in 2 blocks",
        "        suppressed: 288 bytes in 1 blocks",
        "used_suppression: 1 blocks, 288 bytes: glibc-tls default.supp:5",
    ]


def test_summary_only_has_no_records_and_generate_adds_a_suppression_each():
    summary = render_leak_check(SYMBOLIZED, CHECK, LeakCheckSettings(summary_only=True))
    assert "loss record" not in summary and "LEAK SUMMARY:" in summary
    generated = render_leak_check(SYMBOLIZED, CHECK, dataclasses.replace(LeakCheckSettings(), generate=True))
    assert generated.count("Memcheck:Leak") == 3
