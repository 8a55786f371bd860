"""Programs on musl's libc (Debian's musl-gcc: /lib/ld-musl-x86_64.so.1, which is its libc too):
the BPF engine traces them exactly, launched and attached; the in-process library, built for
glibc, is never loaded into one: a launch is refused before the program starts, an attach
before anything is called in it, each in one line that names musl."""

from __future__ import annotations

import signal
import subprocess

import pytest

from conftest import PROGRAMS
from helpers import TIMEOUT, AttachedTrace, final_report, run_command, sites, wait_for_line

pytestmark = pytest.mark.usefixtures("cpu_hogs")
SITES = {"site_a": [(16, 10)], "site_b": [(16, 10)], "site_c": [(16, 10)], "site_d": [(16, 20)]}


@pytest.fixture(scope="module")
def musl(build_dir):
    def build(name: str):
        out = build_dir / f"{name}_musl"
        subprocess.run(["musl-gcc", "-O0", "-g", "-o", str(out), str(PROGRAMS / f"{name}.c")], check=True)
        return out

    return build


def test_the_bpf_engine_counts_a_musl_command_exactly(musl):
    report = final_report(run_command(["-c", str(musl("sites")), "--json", "3600"]))
    assert {name: sites(report).get(name) for name in SITES} == SITES


def test_the_bpf_engine_counts_an_attached_musl_process_exactly(musl):
    """attach_target on musl, its threads allocating all along: what SIGUSR1 keeps, exactly."""
    target = subprocess.Popen([str(musl("attach_target"))], stdout=subprocess.PIPE)
    try:
        assert wait_for_line(target.stdout) == b"ready\n"
        trace = AttachedTrace(target.pid, "3600")
        target.send_signal(signal.SIGUSR1)
        assert wait_for_line(target.stdout) == b"done\n"
        status, out, err = trace.stop()
        assert target.poll() is None
    finally:
        target.kill()
        target.wait(timeout=TIMEOUT)
    report = final_report(subprocess.CompletedProcess([], status, out, err))
    kept = sites(report)
    assert kept.get("keep") == [(100, 50), (101, 50), (102, 50), (103, 50)], kept
    assert (3000, 7) in kept.get("main", []), kept


def test_the_in_process_engine_refuses_a_musl_command_before_it_starts(musl):
    """Loaded into a musl program, the glibc library stopped it from starting (exit 127)."""
    result = run_command(["-c", str(musl("sites")), "--engine", "preload", "3600"])
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "runs on musl (/lib/ld-musl-x86_64.so.1)" in line and "was not started" in line, line


def test_the_in_process_attach_refuses_a_musl_process_naming_it(musl):
    target = subprocess.Popen([str(musl("idle")), "30"])
    try:
        result = run_command(["-p", str(target.pid), "--engine", "preload", "1", "1"])
        assert result.returncode == 1 and "runs on musl" in result.stderr, result.stderr
        assert target.poll() is None
    finally:
        target.kill()
        target.wait()
