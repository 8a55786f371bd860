"""Fault injection: the target, or leaktrace itself, killed at random moments, many times over.

For each moment: leaktrace ends within a bounded time with its documented status and a last
line that says what happened; the final report it could still give is there; no uprobe link
or BPF program of its own is left; no process it touched is left stopped or traced; no
output file is left partial under its final name. Real BPF, real processes, real signals.

Every test here runs with a CPU hog on every core (an idle machine hides races), and the
random moments come from one seed, printed with each test's output (LEAKTRACE_FAULT_SEED
replays a failure).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import leaktrace_command, uprobe_links
from helpers import SLOWDOWN, reports, wait_for_start

# Per moment; more for a soak, fewer where every instruction is emulated (a test VM under TCG).
TRIES = int(os.environ.get("LEAKTRACE_FAULT_TRIES") or max(4, round(20 / SLOWDOWN)))
ENDS_WITHIN = 10.0 * SLOWDOWN  # seconds from the target's death (or leaktrace's) to all being let go
ENDS_AFTER_TARGET = 2.0  # seconds from the target's exit to leaktrace's own, final report written
SEED = int(os.environ.get("LEAKTRACE_FAULT_SEED", str(time.time_ns() % 1_000_000_007)))


pytestmark = pytest.mark.usefixtures("cpu_hogs")


@pytest.fixture(autouse=True)
def seeded():
    """Each test's random moments from SEED, printed (pytest shows it with a failure)."""
    print(f"LEAKTRACE_FAULT_SEED={SEED}")
    random.seed(SEED)


# The names of the BPF programs leaktrace loads (bpftool shows 15 characters).
OUR_PROGRAMS = {
    "alloc_enter",
    "alloc_return",
    "free_enter",
    "unwind_frames",
    "exit_stop",
    "modules_changed",
    "process_exec",
    "task_newtask",
    "process_exit",
}


def our_bpf_programs() -> set[int]:
    listing = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True).stdout
    return {p["id"] for p in json.loads(listing) if p.get("name") in OUR_PROGRAMS}


def status_of(pid: int) -> tuple[str, int] | None:
    """(state letter, tracer pid) of a process; None once it is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    state = re.search(r"^State:\s+(\S)", text, re.M).group(1)
    return None if state in "ZX" else (state, int(re.search(r"^TracerPid:\s+(\d+)", text, re.M).group(1)))


def held(pid: int) -> bool:
    """Stopped (SIGSTOP, or a ptrace stop) or traced."""
    found = status_of(pid)
    return found is not None and (found[0] in "Tt" or found[1] != 0)


def assert_let_go(pid: int) -> None:
    """Within ENDS_WITHIN, the process is gone or runs free (neither stopped nor traced)."""
    deadline = time.monotonic() + ENDS_WITHIN
    while held(pid):
        assert time.monotonic() < deadline, f"pid {pid} left {status_of(pid)}"
        time.sleep(0.01)


def assert_nothing_of_ours_left(links_before: set[int], programs_before: set[int]) -> None:
    """Links close with leaktrace's descriptors; the kernel frees them (and the programs) soon after."""
    deadline = time.monotonic() + ENDS_WITHIN
    while uprobe_links() - links_before or our_bpf_programs() - programs_before:
        assert time.monotonic() < deadline, "uprobe links or BPF programs of leaktrace left"
        time.sleep(0.05)


class Run:
    """leaktrace -c COMMAND ARGS, its command's pid read from its first line; its stdout (the
    reports, and the command's own lines) read as it comes, so that a report is never held up
    by a full pipe."""

    def __init__(self, command: str, *args: str):
        self.links, self.programs = uprobe_links(), our_bpf_programs()
        self.process = subprocess.Popen(
            leaktrace_command("-c", command, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.first_line = wait_for_start(self.process.stderr, 60 * SLOWDOWN)
        found = re.search(r"command '.*' (\d+) through", self.first_line)
        assert found, self.first_line
        self.target = int(found.group(1))
        self._out: list[str] = []
        self._reader = threading.Thread(target=lambda: self._out.extend(self.process.stdout), daemon=True)
        self._reader.start()

    def first_report(self) -> None:
        """Waits until the first report (JSON) is out."""
        reported = self.wait_until(lambda: any(line.startswith("{") for line in self._out), timeout=60 * SLOWDOWN)
        assert reported, "no report"

    def wait_until(self, condition, timeout: float = 20 * SLOWDOWN) -> bool:
        """Polls condition() until it holds (True) or leaktrace or time runs out (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            if condition():
                return True
            time.sleep(0.0005)
        return False

    def held_by_leaktrace(self) -> bool:
        found = status_of(self.target)
        return found is not None and found[1] == self.process.pid

    def finish(self) -> tuple[int, str, str]:
        """Waits for leaktrace to end (it must, within ENDS_WITHIN); checks nothing of it is left."""
        try:
            self.process.wait(timeout=ENDS_WITHIN)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"leaktrace did not end: {self.process.stderr.read()[-2000:]}")
        self._reader.join()
        out, err = "".join(self._out), self.process.stderr.read()
        assert "Traceback" not in err, err
        assert_let_go(self.target)
        assert_nothing_of_ours_left(self.links, self.programs)
        return self.process.returncode, out, err

    def kill_leaktrace(self) -> None:
        """SIGKILL: no handler runs, no report, nothing closed but by the kernel."""
        self.process.kill()
        self.process.wait()
        assert_let_go(self.target)
        assert_nothing_of_ours_left(self.links, self.programs)

    def kill_target(self) -> None:
        try:
            os.kill(self.target, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def cleanup(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.kill_target()
        self.process.stderr.close()


def assert_ended_by_the_kill(status: int, out: str, err: str) -> None:
    """Exit 137 (128 + SIGKILL, as a shell says), the last line says how the target ended, and the
    final report is the last one leaktrace could read (its first report was read before the kill)."""
    assert status == 128 + signal.SIGKILL, err
    assert err.splitlines()[-1].endswith("was killed by SIGKILL"), err
    assert reports(out), "no final report"


@pytest.fixture(scope="module")
def heap(program):
    """many_blocks: 100,000 blocks held until killed (the preload engine's table read of them
    holds the target about 0.2 s here)."""
    return f"{program('many_blocks')} 100000 0"


@pytest.fixture(scope="module")
def small_heap(program):
    """many_blocks: 20,000 blocks held until killed: the BPF engine's reports of them are quick."""
    return f"{program('many_blocks')} 20000 0"


@pytest.fixture(scope="module")
def heavy_heap(program):
    """many_blocks: 20,000 blocks and 256 MiB of zeros: a freeze copies it for a while."""
    return f"{program('many_blocks')} 20000 0 256"


@pytest.mark.parametrize("engine", ["preload", "bpf"])
def test_target_killed_while_held_for_a_report(heap, heavy_heap, engine):
    """--engine preload reads the table with the target stopped; --unreachable freezes it
    (registers, then a copy of its memory): the kill lands in that stop (about 0.2 and 0.1 s)."""
    command, args = (heap, ("--engine", "preload")) if engine == "preload" else (heavy_heap, ("--unreachable",))
    landed = 0
    for _ in range(TRIES):
        run = Run(command, *args, "--json", "0.1")
        try:
            run.first_report()
            if run.wait_until(run.held_by_leaktrace):
                time.sleep(random.uniform(0, 0.01))
                landed += held(run.target)
            run.kill_target()
            assert_ended_by_the_kill(*run.finish())
        finally:
            run.cleanup()
    assert landed >= TRIES // 2, f"only {landed} of {TRIES} kills landed while the target was held"


def whole_outputs(prefix: Path, leak_info: Path) -> None:
    """Every output under its final name is whole: a heap dump ends with its END line, a
    leak-info buffer is whole entries (size, count, 16 pcs: 18 words)."""
    for dump in prefix.parent.glob(f"{prefix.name}.*.txt"):
        assert dump.read_text().endswith("END\n"), dump
    if leak_info.exists():
        assert leak_info.stat().st_size % (18 * 8) == 0


def test_target_killed_at_any_moment_of_reports_and_their_files(small_heap, tmp_path):
    """Reports every 0.1 s with a heap dump and a leak-info file each: between polls, while the
    snapshot is read, symbolized (maps gone) or written."""
    for attempt in range(TRIES):
        prefix, leak_info = tmp_path / f"heap{attempt}", tmp_path / f"leak{attempt}.bin"
        run = Run(
            small_heap,
            "--json",
            "--heap-dump",
            str(prefix),
            "--heap-dump-on-exit",
            "--leak-info",
            str(leak_info),
            "0.1",
        )
        try:
            run.first_report()
            run.wait_until(lambda: False, timeout=random.uniform(0, 0.8))
            run.kill_target()
            status, out, err = run.finish()
            assert_ended_by_the_kill(status, out, err)
            whole_outputs(prefix, leak_info)
        finally:
            run.cleanup()


def test_children_dying_while_their_inheritance_is_copied(program):
    """-f: 40 children, each leaving 0-20 ms after its fork (a third by SIGKILL), many before
    user space has copied what they inherited; three such families."""
    for _ in range(3):
        run = Run(f"{program('many_blocks')} 2000 1 forks", "-f", "--json", "0.05")
        try:
            status, out, err = run.finish()
        finally:
            run.cleanup()
        assert status == 0, err
        assert err.splitlines()[-1].endswith("exited with status 0")
        final = reports(out)[-1]
        parent = [
            g
            for g in final["groups"]
            if g["pid"] == run.target and g["frames"] and g["frames"][0]["function"] in ("site_a", "site_b", "site_c")
        ]
        assert sum(g["count"] for g in parent) == 2000


def test_processes_dying_while_the_kernel_tables_are_cleaned(program):
    """--all: 60 processes that live 0-20 ms, while the tables are cleaned of those gone."""
    links, programs = uprobe_links(), our_bpf_programs()
    trace = subprocess.Popen(
        leaktrace_command("--all", "--comm", "many_blocks", "--json", "0.2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "probes live" in wait_for_start(trace.stderr, 60)
        for _ in range(2):
            children = subprocess.run(
                [str(program("many_blocks")), "100", "1", "forks"], capture_output=True, timeout=60
            )
            assert children.returncode == 0
        time.sleep(1.5)  # more than a cleaning interval
        trace.send_signal(signal.SIGINT)
        out, err = trace.communicate(timeout=ENDS_WITHIN)
    finally:
        if trace.poll() is None:
            trace.kill()
            trace.communicate()
    assert trace.returncode == 0 and "Traceback" not in err, err
    assert reports(out)
    assert_nothing_of_ours_left(links, programs)


def test_leaktrace_killed_while_it_holds_the_command_at_its_exit(program):
    """-c stops its command in _exit (SIGSTOP from the BPF program) to read its last state:
    a leaktrace killed then must not leave it stopped for good."""
    caught = 0
    for _ in range(TRIES):
        run = Run(f"{program('many_blocks')} 20000 -1", "--json", "3600")
        try:
            if run.wait_until(lambda run=run: (status_of(run.target) or ("",))[0] == "T", timeout=30 * SLOWDOWN):
                run.process.send_signal(signal.SIGSTOP)  # so that it cannot let the command go first
                caught += (status_of(run.target) or ("",))[0] == "T"
            run.kill_leaktrace()
        finally:
            run.cleanup()
    assert caught >= TRIES // 2, f"only {caught} of {TRIES} kills came while the command was held"


@pytest.mark.parametrize("engine", ["preload", "bpf"])
def test_leaktrace_killed_while_it_holds_the_target_in_a_ptrace_stop(heap, heavy_heap, engine):
    """The preload engine's table read, and the reachability check's freeze (of a heap it takes
    a while to copy, so that the kill lands in it), hold every thread in a ptrace stop: the
    kernel lets them go when leaktrace dies."""
    args = ("--engine", "preload") if engine == "preload" else ("--unreachable",)
    landed = 0
    for _ in range(TRIES):
        run = Run(heap if engine == "preload" else heavy_heap, *args, "--json", "0.1")
        try:
            if run.wait_until(run.held_by_leaktrace):
                time.sleep(random.uniform(0, 0.01))
                landed += held(run.target)
            run.kill_leaktrace()
        finally:
            run.cleanup()
    assert landed >= TRIES // 2, f"only {landed} of {TRIES} kills of leaktrace came while it held the target"


def test_leaktrace_killed_while_writing_its_files(small_heap, tmp_path):
    for attempt in range(TRIES):
        prefix, leak_info = tmp_path / f"heap{attempt}", tmp_path / f"leak{attempt}.bin"
        run = Run(small_heap, "--json", "--heap-dump", str(prefix), "--leak-info", str(leak_info), "0.1")
        try:
            run.wait_until(lambda: False, timeout=random.uniform(0.3, 1.2))
            run.kill_leaktrace()
            whole_outputs(prefix, leak_info)
        finally:
            run.cleanup()


@pytest.fixture(scope="module")
def busy(program):
    """busy_heap: 5,000 blocks kept, three threads allocating and freeing, each replaced by a
    new one every few hundred calls (threads exit all the time), for MS milliseconds."""
    return lambda ms, *more: " ".join([str(program("busy_heap")), "5000", "3", str(ms), *more])


def ends_soon_after_its_target(run: Run) -> tuple[int, str, str]:
    """Waits for the target to be gone, then for leaktrace: within ENDS_AFTER_TARGET of it."""
    deadline = time.monotonic() + 60
    while status_of(run.target) is not None and time.monotonic() < deadline:
        time.sleep(0.002)
    gone_at = time.monotonic()
    try:
        run.process.wait(timeout=ENDS_AFTER_TARGET)
    except subprocess.TimeoutExpired:
        pass
    took = time.monotonic() - gone_at
    status, out, err = run.finish()
    assert took < ENDS_AFTER_TARGET, f"leaktrace ended {took:.2f} s after its target: {err[-1500:]}"
    return status, out, err


@pytest.mark.parametrize("engine", ["preload", "bpf"])
def test_a_target_exiting_while_a_report_holds_it_never_hangs_leaktrace(busy, engine):
    """Reports every 0.05 s hold the target (the preload table read; the BPF engine's
    reachability freeze) while it exits at a random moment, with threads exiting all the
    time: every seized thread is let go or reaped, and leaktrace ends with its final report."""
    args = ("--engine", "preload") if engine == "preload" else ("--unreachable",)
    for _ in range(TRIES):
        run = Run(busy(random.randint(300, 1500)), *args, "--json", "0.05")
        try:
            status, out, err = ends_soon_after_its_target(run)
            assert status == 0, err
            assert err.splitlines()[-1].endswith("exited with status 0"), err
            assert reports(out), "no final report"
            assert "traces it" not in err, err  # never held by leaktrace itself
        finally:
            run.cleanup()


@pytest.mark.parametrize("engine", ["preload", "bpf"])
def test_a_target_killed_while_a_report_holds_it_never_hangs_leaktrace(busy, engine):
    args = ("--engine", "preload") if engine == "preload" else ("--unreachable",)
    for _ in range(TRIES):
        run = Run(busy(0), *args, "--json", "0.05")
        try:
            run.first_report()
            run.wait_until(run.held_by_leaktrace, timeout=5)
            time.sleep(random.uniform(0, 0.005))
            run.kill_target()
            status, out, err = ends_soon_after_its_target(run)
            assert_ended_by_the_kill(status, out, err)
        finally:
            run.cleanup()
