"""The CPython interpreters the Python-frame tests run on, one a version the walk knows, from
where a machine has them: Debian 12's python3.11 and Debian 13's python3.13 (in the root
scripts/setup.sh --tests makes with debootstrap, run in a mount namespace of its own with
/proc mounted, as a container would be: a target whose files are not leaktrace's), and
pyenv's builds of 3.12 and 3.13 where present. In CI (CI set) a required interpreter that is
missing fails its tests (the tests leave out an optional one that is missing); the run's header
says which ran."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DEBIAN13 = Path(__file__).parents[1] / "build" / "debian13"  # setup.sh --tests makes it


@dataclass(frozen=True)
class Interpreter:
    name: str
    version: str  # major.minor
    pattern: str  # the program's path, as the process sees it (a glob: the newest match is taken)
    required: bool  # in CI: missing is a failure
    root: Path | None = None  # the root it runs in, in a mount namespace of its own

    @property
    def path(self) -> str | None:
        """The program's path on this machine's root, if it is there."""
        found = sorted(glob.glob(str(self.root) + self.pattern if self.root else self.pattern))
        return found[-1] if found else None

    def command(self, *args: str) -> list[str]:
        """The argv that runs the interpreter with args (paths as the process sees them)."""
        if self.root is None:
            return [self.wanted(), *args]
        self.wanted()
        inner = 'mount -t proc proc "$0/proc" && exec chroot "$0" "$@"'
        return ["unshare", "-m", "--propagation", "private", "sh", "-c", inner, str(self.root), self.pattern, *args]

    def workdir(self, tmp_path: Path) -> tuple[Path, str]:
        """A directory for a test's files: (its path here, its path as the process sees it)."""
        if self.root is None:
            return tmp_path, str(tmp_path)
        seen = f"/tmp/leaktrace-test-{uuid.uuid4().hex[:12]}"
        here = self.root / seen.lstrip("/")
        here.mkdir(parents=True)
        return here, seen

    def host_path(self, seen: str) -> Path:
        """Where a file the process names lies on this machine's root."""
        return self.root / seen.lstrip("/") if self.root else Path(seen)

    def wanted(self) -> str:
        """Its program's path here; a test without it is skipped, or fails where CI needs it."""
        import pytest

        path = self.path
        if path is None:
            message = f"CPython {self.version} is not on this machine ({self.pattern})"
            if self.required and os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
        return path


INTERPRETERS = (
    Interpreter("3.11-debian12", "3.11", "/usr/bin/python3.11", required=True),
    Interpreter("3.12-pyenv", "3.12", "/root/.pyenv/versions/3.12.*/bin/python3.12", required=False),
    Interpreter("3.13-pyenv", "3.13", "/root/.pyenv/versions/3.13.*/bin/python3.13", required=False),
    Interpreter("3.13-debian13", "3.13", "/usr/bin/python3.13", required=True, root=DEBIAN13),
)


@cache
def module_file(interpreter: Interpreter, module: str) -> str:
    """Where an interpreter's standard module lives, as its process names it."""
    argv = interpreter.command("-c", f"import {module}; print({module}.__file__)")
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def placed(interpreter: Interpreter, script: Path, tmp_path: Path) -> tuple[Path, str]:
    """script copied where the interpreter's process sees it: (its directory here, its path there)."""
    here, seen = interpreter.workdir(tmp_path)
    shutil.copy(script, here / script.name)
    return here, f"{seen}/{script.name}"


def header() -> str:
    """The line that says which interpreters the Python-frame tests run on."""
    found = [f"{i.name} ({i.path})" for i in INTERPRETERS if i.path]
    missing = [i.name for i in INTERPRETERS if not i.path]
    return "python frames on: " + ", ".join(found) + (f"; not on this machine: {', '.join(missing)}" if missing else "")
