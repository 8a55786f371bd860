"""Which tests a run can hold: a user who is not root runs tests/unit only (the integration
tests load BPF programs), told in one line; in CI (CI set) a run that is not root fails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

INTEGRATION = Path(__file__).parent / "integration"


def pytest_configure(config):
    if os.geteuid() != 0 and os.environ.get("CI"):
        pytest.exit("leaktrace's CI runs its tests as root: tests/integration load BPF programs", returncode=1)


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    if os.geteuid() != 0 and (collection_path == INTEGRATION or INTEGRATION in collection_path.parents):
        return True
    return None


def pytest_report_header(config) -> str | None:
    """Which CPython versions the Python-frame tests run on."""
    from python_interpreters import header

    return header()


def pytest_terminal_summary(terminalreporter) -> None:
    if os.geteuid() != 0:
        terminalreporter.write_line("not root: tests/integration left out (they load BPF programs); tests/unit ran")
