"""each(items): items as a list, asserted non-empty, so that `assert all(... for x in each(items))`
cannot pass over nothing (tests/unit/test_docs.py holds every `assert all(` to it)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


def each(items: Iterable[T]) -> list[T]:
    found = list(items)
    assert found, "an assertion over every item found none"
    return found
