"""The command line a new user meets first: --version, the top-level help, a bare call."""

from __future__ import annotations

import subprocess
import sys

from leaktrace.commands import REGISTRY, SUMMARIES


def leaktrace(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "leaktrace.cli", *args], capture_output=True, text=True, timeout=60)


def test_version():
    result = leaktrace("--version")
    assert result.returncode == 0 and result.stdout.startswith("leaktrace ") and result.stderr == ""


def test_the_top_level_help_names_every_command_with_examples():
    result = leaktrace("--help")
    assert result.returncode == 0
    assert set(SUMMARIES) == set(REGISTRY)
    for name, line in SUMMARIES.items():
        assert f"  {name:18} {line}" in result.stdout
    assert "examples:\n  sudo leaktrace -p 1234 10" in result.stdout


def test_a_bare_call_prints_its_usage_and_what_it_needs():
    result = leaktrace()
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("usage: leaktrace ")
    assert result.stderr.splitlines()[-1] == (
        "leaktrace: needs -p PID, -c CMD or --all; leaktrace --help lists every command"
    )
