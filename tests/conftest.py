"""Fixtures: C test programs built once per session, and a runner for the real CLI.

These tests load real BPF programs and need root. They never skip: on a
machine where BPF cannot run they fail, saying why.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROGRAMS = Path(__file__).parent / "programs"
UPROBE_EVENTS = Path("/sys/kernel/tracing/uprobe_events")


def pytest_configure(config):
    if os.geteuid() != 0:
        pytest.exit("leaktrace's tests load BPF programs and must run as root (see README)", returncode=1)


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("programs")


@pytest.fixture(scope="session")
def program(build_dir):
    """program(name, *flags) -> path of tests/programs/NAME.c compiled with frame pointers."""
    built: dict[tuple, Path] = {}

    def build(name: str, *flags: str) -> Path:
        key = (name, flags)
        if key not in built:
            out = build_dir / (name + "".join(f.replace("-", "_") for f in flags))
            subprocess.run(["gcc", "-O0", "-g", "-fno-omit-frame-pointer", "-pthread", *flags,
                            "-o", str(out), str(PROGRAMS / f"{name}.c")], check=True)
            built[key] = out
        return built[key]
    return build


def leaktrace_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "leaktrace.cli", *args]


def uprobe_events() -> str:
    return UPROBE_EVENTS.read_text() if UPROBE_EVENTS.exists() else ""


@pytest.fixture
def probes_left_as_found():
    """Asserts that tracefs uprobe_events is the same after the test as before it."""
    before = uprobe_events()
    yield
    assert uprobe_events() == before
