"""An assertion over every item of a list cannot pass over an empty one: each `assert all(` in
the tests takes its items through tests/each.py, which asserts that there are some."""

from __future__ import annotations

from pathlib import Path

from each import each

TESTS = Path(__file__).parents[1]


def test_every_assertion_over_all_items_asserts_there_are_some():
    vacuous = [
        f"{path.relative_to(TESTS)}:{number}"
        for path in sorted(TESTS.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "assert all(" in line and "each(" not in line and path.name not in ("each.py", "test_assertions.py")
    ]
    assert vacuous == []


def test_each_refuses_nothing():
    assert each(iter([3])) == [3]
    try:
        each([])
    except AssertionError:
        return
    raise AssertionError("each([]) passed")
