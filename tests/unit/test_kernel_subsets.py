"""The integration tests that run in test VMs (tests/integration/kernel_subset.txt, and
kernel_ci.txt, which CI runs on Debian 12's kernel) name tests that exist: a renamed test
would otherwise leave a VM run with nothing to run for it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LISTS = ("kernel_subset.txt", "kernel_ci.txt")


def listed(name: str) -> list[str]:
    text = (ROOT / "tests" / "integration" / name).read_text()
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("name", LISTS)
def test_every_listed_test_exists(name):
    for node in listed(name):
        path, test = node.split("::")
        function = re.sub(r"\[.*\]$", "", test)
        assert re.search(rf"^def {function}\(", (ROOT / path).read_text(), re.M), node


def test_ci_runs_a_part_of_the_subset():
    assert set(listed("kernel_ci.txt")) <= set(listed("kernel_subset.txt"))
