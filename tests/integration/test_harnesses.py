"""The gate in real test harnesses, as docs/ci.md shows them: an automake suite (made by the
test, built by Debian's autoconf and automake) run by `make check` with LOG_COMPILER, a
meson project run by `meson test --wrapper`, and a CMake project whose add_test wraps each
test, run by ctest. The test that leaks fails, the one that does not passes, and the
harness's log carries leaktrace's leak summary."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

LEAKTRACE = str(Path(sys.executable).parent / "leaktrace")  # the venv's entry point
GATE_FLAGS = "--leak-check=full --error-exitcode=1 --"
LEAKS = r"""#include <stdlib.h>
void *volatile kept;
__attribute__((noinline)) static void lose(void) { kept = malloc(48); kept = malloc(48); kept = 0; }
int main(void) { lose(); return 0; }
"""
CLEAN = r"""#include <stdlib.h>
int main(void) { void *volatile p = malloc(48); free(p); return 0; }
"""
pytestmark = pytest.mark.usefixtures("cpu_hogs")


def sources(root: Path) -> None:
    root.mkdir()
    (root / "leaks.c").write_text(LEAKS)
    (root / "tidy.c").write_text(CLEAN)


def run(command: list[str], cwd: Path, timeout: int = 600, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, **kwargs)


@pytest.mark.parametrize("engine", ["bpf", "preload"])
def test_automake_log_compiler_fails_the_leaking_test_only(tmp_path, engine):
    """Either engine's gate: the in-process one is the fast one (docs/ci.md)."""
    root = tmp_path / "suite"
    sources(root)
    (root / "configure.ac").write_text(
        "AC_INIT([gated], [1.0])\nAM_INIT_AUTOMAKE([foreign])\nAC_PROG_CC\nAC_CONFIG_FILES([Makefile])\nAC_OUTPUT\n"
    )
    (root / "Makefile.am").write_text(
        "check_PROGRAMS = leaks tidy\nleaks_CFLAGS = -g -O0\ntidy_CFLAGS = -g -O0\nTESTS = leaks tidy\n"
    )
    for step in (["autoreconf", "-fi"], ["./configure", "-q"]):
        done = run(step, root)
        assert done.returncode == 0, done.stderr
    gated = run(["make", "check", f"LOG_COMPILER={LEAKTRACE}", f"LOG_FLAGS=--engine {engine} {GATE_FLAGS}"], root)
    assert gated.returncode != 0, gated.stdout + gated.stderr
    assert "FAIL: leaks" in gated.stdout and "PASS: tidy" in gated.stdout, gated.stdout
    assert "# PASS:  1" in gated.stdout and "# FAIL:  1" in gated.stdout, gated.stdout
    log = (root / "leaks.log").read_text()
    assert "definitely lost: 96 bytes in 2 blocks" in log, log
    assert "definitely lost: 0 bytes in 0 blocks" in (root / "tidy.log").read_text()


@pytest.mark.parametrize("engine", ["bpf", "preload"])
def test_meson_test_wrapper_fails_the_leaking_test_only(tmp_path, engine):
    root = tmp_path / "project"
    sources(root)
    (root / "meson.build").write_text(
        "project('gated', 'c')\n"
        "test('leaks', executable('leaks', 'leaks.c'))\n"
        "test('tidy', executable('tidy', 'tidy.c'))\n"
    )
    done = run(["meson", "setup", "build", "--buildtype=debug"], root)
    assert done.returncode == 0, done.stdout + done.stderr
    gated = run(
        [
            *("meson", "test", "-C", "build", "--num-processes", "1"),
            *("--wrapper", f"{shlex.quote(LEAKTRACE)} --engine {engine} {GATE_FLAGS}"),
        ],
        root,
        env={**os.environ, "MESON_TESTTHREADS": "1"},
    )
    assert gated.returncode != 0, gated.stdout
    lines = gated.stdout.splitlines()
    assert any("leaks" in line and "FAIL" in line for line in lines), gated.stdout
    assert any("tidy" in line and " OK " in line for line in lines), gated.stdout
    [log_file] = (root / "build" / "meson-logs").glob("testlog*.txt")  # testlog-WRAPPER.txt with --wrapper
    log = log_file.read_text()
    assert "definitely lost: 96 bytes in 2 blocks" in log, log[-3000:]


@pytest.mark.parametrize("engine", ["bpf", "preload"])
def test_ctest_add_test_wrapper_fails_the_leaking_test_only(tmp_path, engine):
    root = tmp_path / "cmake_project"
    sources(root)
    gate = " ".join(shlex.quote(word) for word in [LEAKTRACE, "--engine", engine, *GATE_FLAGS.split()])
    (root / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.13)\nproject(gated C)\nset(CMAKE_BUILD_TYPE Debug)\nenable_testing()\n"
        + "".join(
            f"add_executable({name} {name}.c)\nadd_test(NAME {name} COMMAND {gate} $<TARGET_FILE:{name}>)\n"
            for name in ("leaks", "tidy")
        )
    )
    for step in (["cmake", "-S", ".", "-B", "build"], ["cmake", "--build", "build"]):
        done = run(step, root)
        assert done.returncode == 0, done.stdout + done.stderr
    gated = run(["ctest", "--test-dir", "build", "-j1"], root)
    assert gated.returncode != 0, gated.stdout
    lines = gated.stdout.splitlines()
    assert any("leaks" in line and "Failed" in line for line in lines), gated.stdout
    assert any("tidy" in line and "Passed" in line for line in lines), gated.stdout
    assert "50% tests passed, 1 tests failed out of 2" in gated.stdout, gated.stdout
    log = (root / "build" / "Testing" / "Temporary" / "LastTest.log").read_text()
    assert "definitely lost: 96 bytes in 2 blocks" in log, log[-3000:]
    assert "definitely lost: 0 bytes in 0 blocks" in log, log[-3000:]
