"""leaktrace --all: several real programs at once, each with an exact shape
(tests/integration/programs/workers.c), traced systemwide with real BPF."""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from leaktrace import BpfTrace, EngineSettings
from leaktrace.sources.bpf.process_tracking import Selection

from conftest import leaktrace_command
from helpers import TIMEOUT, reports, wait_for_line, wait_for_start


class Workers:
    """tests/integration/programs/workers.c processes, started after the probes are live."""

    def __init__(self, binary: Path, prefix: tuple[str, ...] = ()):
        self.binary = binary
        self.prefix = prefix
        self.processes: list[subprocess.Popen] = []
        self.pids: list[int] = []  # every pid that said ready (forked children too)

    def start(self, mode: str, readies: int = 1) -> list[int]:
        """Starts one in MODE; returns the pids that said ready (a forking mode says it twice)."""
        process = subprocess.Popen([*self.prefix, str(self.binary), mode], stdout=subprocess.PIPE, bufsize=0)
        self.processes.append(process)
        pids = []
        for _ in range(readies):
            line = self.read_line(process)
            assert line.startswith("ready "), line
            pids.append(int(line.split()[1]))
        self.pids += pids
        return pids

    @staticmethod
    def read_line(process: subprocess.Popen) -> str:
        """One line of a worker's stdout, byte by byte: two processes (fork) may write two lines
        at once, and a buffered reader would hide the second from select()."""
        line = b""
        while not line.endswith(b"\n"):
            ready, _, _ = select.select([process.stdout], [], [], TIMEOUT)
            assert ready, "timed out waiting for a worker"
            byte = os.read(process.stdout.fileno(), 1)
            if not byte:
                break
            line += byte
        return line.decode()

    def stop(self) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()


class SystemTrace:
    """leaktrace --all --json INTERVAL ARGS, read report by report."""

    def __init__(self, *args: str, interval: float = 0.3):
        self.process = subprocess.Popen(
            leaktrace_command("--all", "--json", str(interval), *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started = wait_for_start(self.process.stderr)
        if "probes live" not in self.started:
            self.process.kill()
            raise AssertionError(self.started + self.process.stderr.read())

    def next_report(self) -> dict:
        while True:
            line = wait_for_line(self.process.stdout)
            assert line, "leaktrace stopped: " + self.process.stderr.read()
            found = reports(line)
            if found:
                return found[0]

    def report_after(self, moment: float) -> dict:
        """The first report taken after moment (wall clock)."""
        while True:
            report = self.next_report()
            if report["time"] > moment:
                return report

    def stop(self) -> tuple[int, str]:
        self.process.send_signal(signal.SIGINT)
        out, err = self.process.communicate(timeout=TIMEOUT)
        return self.process.returncode, err


def per_site(report: dict, pid: int) -> dict[tuple[str, bool], list[tuple[int, int]]]:
    """(innermost function, inherited) -> sorted [(size, count)] of one process (its
    stacks through that function merged)."""
    table = defaultdict(Counter)
    for group in report["groups"]:
        if group["pid"] != pid or group["stack_status"] != "captured":
            continue
        frame = group["frames"][0]
        table[frame["function"] or hex(frame["address"]), group["inherited"]][group["size"]] += group["count"]
    return {key: sorted(sizes.items()) for key, sizes in table.items()}


def our_sites(report: dict, pid: int) -> dict:
    """per_site without what libc allocates for itself (stdio buffers, thread TLS)."""
    return {
        key: value
        for key, value in per_site(report, pid).items()
        if re.match(r"(leak|exit|after_exec)_site|before_fork|in_child|before_exec", key[0])
    }


def process_entry(report: dict, pid: int) -> dict | None:
    return next((p for p in report["processes"] if p["pid"] == pid), None)


@pytest.fixture
def workers(program):
    started = Workers(program("workers"))
    yield started
    started.stop()


def test_several_programs_at_once_exact_per_process(workers, probes_left_as_found):
    trace = SystemTrace("--comm", "^workers$")
    try:
        [leak] = workers.start("leak")
        [churn] = workers.start("churn")
        [exiting] = workers.start("exit")
        parent, child = sorted(workers.start("fork", readies=2))  # the child's pid is the larger here
        [execed] = workers.start("exec")
        report = trace.report_after(time.time())

        assert our_sites(report, leak) == {("leak_site", False): [(1000, 5)]}
        assert our_sites(report, exiting) == {("exit_site", False): [(300, 3)]}
        assert our_sites(report, parent) == {("before_fork", False): [(200, 2)]}
        # The child inherited both blocks, freed one, and made its own.
        assert our_sites(report, child) == {("before_fork", True): [(200, 1)], ("in_child", False): [(2000, 1)]}
        # exec started the image clean: nothing from before_exec.
        assert our_sites(report, execed) == {("after_exec_site", False): [(4444, 1)]}
        churned = [g for g in report["groups"] if g["pid"] == churn and g["size"] == 64]
        assert sum(g["count"] for g in churned) <= 1  # at most the block between its malloc and free
        assert report["counters"]["allocations"] > 100
        for pid in (leak, churn, exiting, parent, child, execed):
            entry = process_entry(report, pid)
            assert entry and entry["comm"] == "workers" and not entry["exited"]
            assert entry["live_bytes"] == sum(g["bytes"] for g in report["groups"] if g["pid"] == pid)
        assert {p["comm"] for p in report["processes"]} == {"workers"}  # --comm left the rest out

        # Growth: the leaking process grows by 5000 bytes per step.
        os.kill(leak, signal.SIGUSR1)
        assert workers.read_line(workers.processes[0]).startswith("ready")
        grown = trace.report_after(time.time())
        assert our_sites(grown, leak) == {("leak_site", False): [(1000, 10)]}
        assert process_entry(grown, leak)["live_bytes"] - process_entry(report, leak)["live_bytes"] == 5000

        # A process that exits shows its last totals once, then is gone.
        os.kill(exiting, signal.SIGUSR1)
        workers.processes[2].wait(timeout=TIMEOUT)
        last = trace.report_after(time.time())
        give_up = time.time() + 5
        while process_entry(last, exiting) is None and last["time"] < give_up:
            last = trace.next_report()
        entry = process_entry(last, exiting)
        assert entry["exited"]
        assert our_sites(last, exiting) == {("exit_site", False): [(300, 3)]}
        after = trace.next_report()
        assert process_entry(after, exiting) is None
        assert our_sites(after, leak) == {("leak_site", False): [(1000, 10)]}
    finally:
        status, err = trace.stop()
    assert status == 0, err
    assert "Traceback" not in err


def test_exited_processes_leave_nothing_in_the_kernel_tables(program):
    binary = program("workers")
    # setsid -f: the workers are not leaktrace's own children (those are never traced).
    with BpfTrace.everything(EngineSettings(), selection=Selection(comm=re.compile("^workers$"))) as trace:
        workers = Workers(binary, prefix=("setsid", "-f"))
        try:
            parent, child = sorted(workers.start("fork", readies=2))
            [exiting] = workers.start("exit")
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                trace.poll()
                time.sleep(0.02)
            recorded = trace.engine.reader.recorded_pids()
            assert {parent, child, exiting} <= recorded["live"] and {parent, child, exiting} <= recorded["procs"]
            for pid in (parent, child, exiting):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 2.5  # cleaning runs at most once a second
            seen_exited = set()
            while time.monotonic() < deadline:
                trace.poll()
                snapshot = trace.snapshot()
                seen_exited |= {pid for pid, info in snapshot.processes.items() if info.exited}
                time.sleep(0.05)
            assert {parent, child, exiting} <= seen_exited
            for table, pids in trace.engine.reader.recorded_pids().items():
                assert not pids & {parent, child, exiting}, table
        finally:
            workers.stop()


def test_a_full_process_table_counts_processes_not_calls(program):
    """Ten processes making 1,000 blocks each find the process table (2 entries) full: each is
    counted once in unfollowed_children, not once per call."""
    with BpfTrace.everything(EngineSettings(max_procs=2)) as trace:
        started = [subprocess.Popen(["setsid", "-f", str(program("many_blocks")), "1000", "-1"]) for _ in range(10)]
        for process in started:
            process.wait()
        deadline = time.monotonic() + 1
        while time.monotonic() < deadline:
            trace.poll()
            time.sleep(0.02)
        unfollowed = trace.snapshot().counters.unfollowed_children
    # The ten, and the few other processes of the machine that called an allocator meanwhile.
    assert 8 <= unfollowed < 100, unfollowed


def test_uid_and_pid_filters(program, tmp_path):
    shared = Path(tempfile.mkdtemp(prefix="leaktrace-uid-"))
    try:
        os.chmod(shared, 0o755)
        binary = shared / "workers"
        shutil.copy(program("workers"), binary)
        os.chmod(binary, 0o755)
        trace = SystemTrace("--uid", "nobody", "--comm", "^workers$")
        as_root = Workers(binary)
        as_nobody = Workers(binary, prefix=("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"))
        try:
            [root_pid] = as_root.start("leak")
            [nobody_pid] = as_nobody.start("leak")
            report = trace.report_after(time.time())
            assert {p["pid"] for p in report["processes"]} == {nobody_pid}
            assert our_sites(report, nobody_pid) == {("leak_site", False): [(1000, 5)]}
        finally:
            trace.stop()
        trace = SystemTrace("--pid-filter", str(root_pid))
        try:
            os.kill(root_pid, signal.SIGUSR1)
            assert as_root.read_line(as_root.processes[0]).startswith("ready")
            os.kill(nobody_pid, signal.SIGUSR1)
            report = trace.report_after(time.time() + 0.5)
            assert {p["pid"] for p in report["processes"]} == {root_pid}
            # Traced from its first call after the start: the 5 blocks of the second step.
            assert our_sites(report, root_pid) == {("leak_site", False): [(1000, 5)]}
        finally:
            trace.stop()
            as_root.stop()
            as_nobody.stop()
    finally:
        shutil.rmtree(shared)


def test_text_report_groups_by_process_and_flags_growth(workers):
    process = subprocess.Popen(
        leaktrace_command(
            "--all", "0.4", "--comm", "^workers$", "--growth-intervals", "2", "--top-processes", "5", "--top", "2"
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "probes live" in wait_for_start(process.stderr)
        [leak] = workers.start("leak")
        for _ in range(6):  # about a step per interval (a slow report can merge two intervals)
            time.sleep(0.4)
            os.kill(leak, signal.SIGUSR1)
            assert workers.read_line(workers.processes[0]).startswith("ready")
        time.sleep(1.0)
    finally:
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 0, err
    assert "Traceback" not in err
    blocks = out.split("\n[")
    assert re.match(r"\d\d:\d\d:\d\d\] 1 processes: \d+ live bytes", blocks[-1].lstrip("["))
    assert re.search(rf"^ *{leak} +workers +\d+ +\d+ ", out, re.M)
    assert "likely leaks (live bytes rose in each of the last 2 intervals):" in out
    assert re.search(r"growing.*\n.*\n.*\+\d+ B/s +leak_site\+0x", out)
    assert f"pid {leak} (workers): top " in out


def test_systemwide_only_options_need_all():
    for args in (["-p", "1", "--comm", "x"], ["-p", "1", "--min-bytes", "5"], ["-c", "true", "--uid", "0"]):
        result = subprocess.run(leaktrace_command(*args), capture_output=True, text=True, timeout=TIMEOUT)
        assert result.returncode == 2
        assert result.stderr.count("\n") == 1 and "needs --all" in result.stderr, result.stderr
    result = subprocess.run(leaktrace_command("--all", "--comm", "("), capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 2 and "is not a regular expression" in result.stderr


def test_each_distinct_libc_is_probed(program, tmp_path):
    """A process running on a copy of libc (another file, as in a container) is traced too."""
    libc_dir = tmp_path / "otherlibc"
    libc_dir.mkdir()
    system_libc = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")
    shutil.copy(system_libc, libc_dir / "libc.so.6")
    loader = os.path.realpath("/lib64/ld-linux-x86-64.so.2")
    other = Workers(program("workers"), prefix=(loader, "--library-path", str(libc_dir)))
    try:
        [pid] = other.start("leak")
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert str(libc_dir / "libc.so.6") in maps
        trace = SystemTrace("--pid-filter", str(pid))
        try:
            named = trace.started.split(" through ")[1].split(":")[0].split(", ")
            libraries = [name.removesuffix(" (glibc)") for name in named]
            assert system_libc in [os.path.realpath(lib) for lib in libraries]
            assert str(libc_dir / "libc.so.6") in libraries
            os.kill(pid, signal.SIGUSR1)
            assert other.read_line(other.processes[0]).startswith("ready")
            report = trace.report_after(time.time() + 0.3)
            assert our_sites(report, pid) == {("leak_site", False): [(1000, 5)]}
        finally:
            trace.stop()
    finally:
        other.stop()
