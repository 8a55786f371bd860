"""The CPython interpreters the Python-frame tests run on, one a version the walk knows, from
where a machine has them: Debian's python3.11 (setup.sh installs it), pyenv's builds of 3.12
and 3.13 where present. In CI (CI set) an interpreter marked required that is missing fails its
tests; the run's header says which ran."""

from __future__ import annotations

import glob
import os
import subprocess
from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True)
class Interpreter:
    version: str  # major.minor
    pattern: str  # the program's path (a glob: the newest match is taken)
    required: bool  # in CI: missing is a failure

    @property
    def path(self) -> str | None:
        found = sorted(glob.glob(self.pattern))
        return found[-1] if found else None

    @property
    def name(self) -> str:
        return f"{self.version}-{'debian' if self.pattern.startswith('/usr/') else 'pyenv'}"


INTERPRETERS = (
    Interpreter("3.11", "/usr/bin/python3.11", required=True),
    Interpreter("3.12", "/root/.pyenv/versions/3.12.*/bin/python3.12", required=False),
    Interpreter("3.13", "/root/.pyenv/versions/3.13.*/bin/python3.13", required=False),
)


def wanted(interpreter: Interpreter) -> str:
    """Its program's path; a test without it is skipped, or fails where CI needs it."""
    import pytest

    path = interpreter.path
    if path is None:
        message = f"CPython {interpreter.version} is not on this machine ({interpreter.pattern})"
        if interpreter.required and os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@cache
def module_file(program: str, module: str) -> str:
    """Where an interpreter's standard module lives (the frames name that file)."""
    return subprocess.run(
        [program, "-c", f"import {module}; print({module}.__file__)"], capture_output=True, text=True, check=True
    ).stdout.strip()


def header() -> str:
    """The line that says which interpreters the Python-frame tests run on."""
    found = [f"{i.name} ({i.path})" for i in INTERPRETERS if i.path]
    missing = [i.name for i in INTERPRETERS if not i.path]
    return "python frames on: " + ", ".join(found) + (f"; not on this machine: {', '.join(missing)}" if missing else "")
