"""Programs exec'd under `--all` are held at their first allocator call until their unwind
tables are in: whole stacks from their first allocation, even for a program that lives a
few milliseconds; never a stop a job-control shell would see; never a process left stopped,
whenever leaktrace dies. Run with a busy loop on every core."""

from __future__ import annotations

import os
import pty
import random
import signal
import subprocess
import time

import pytest
from test_systemwide import SystemTrace

from helpers import TIMEOUT

pytestmark = pytest.mark.usefixtures("cpu_hogs")
WHOLE = ["alloc_size", "main", "__libc_start_call_main", "__libc_start_main", "_start"]


def stacks_of(trace: SystemTrace, pids: set[int]) -> dict[int, dict[int, tuple[int, list]]]:
    """pid -> size -> (count, functions), from the reports until every pid has been reported."""
    found: dict[int, dict[int, tuple[int, list]]] = {}
    deadline = time.monotonic() + TIMEOUT
    while not pids <= found.keys() and time.monotonic() < deadline:
        report = trace.next_report()
        for group in report["groups"]:
            if group["pid"] in pids:
                functions = [frame["function"] for frame in group["frames"]]
                found.setdefault(group["pid"], {})[group["size"]] = (group["count"], functions)
    return found


def test_a_program_started_under_all_has_whole_stacks_from_its_first_allocation(program, probes_left_as_found):
    """sizes allocates in main at once and exits within milliseconds: its blocks, one of each
    size, have every frame out to _start, in each of eight runs."""
    binary = program("sizes")
    trace = SystemTrace("--comm", "^sizes$")
    try:
        pids = set()
        for _ in range(8):
            process = subprocess.Popen([str(binary), "1111", "2222"])
            process.wait()
            pids.add(process.pid)
        found = stacks_of(trace, pids)
    finally:
        status, errors = trace.stop()
    assert status == 0, errors
    assert found == {pid: {1111: (1, WHOLE), 2222: (1, WHOLE)} for pid in pids}


def test_a_program_with_a_controlling_terminal_is_never_stopped(program):
    """A job-control shell waits with WUNTRACED: a process on a terminal is never held, so its
    parent never sees it stop."""
    binary = program("sizes")
    trace = SystemTrace("--comm", "^sizes$")
    try:
        for _ in range(10):
            pid, terminal = pty.fork()
            if pid == 0:
                os.execv(str(binary), [str(binary), "1111"])
            _, status = os.waitpid(pid, os.WUNTRACED)
            os.close(terminal)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    finally:
        code, errors = trace.stop()
    assert code == 0, errors


def stopped(comm: str) -> list[int]:
    """Processes named comm in the stopped state (T)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    name, state = f.read().rsplit(")", 1)
            except OSError:
                continue
            if name.split("(", 1)[1] == comm and state.split()[0] == "T":
                found.append(int(entry))
    return found


@pytest.mark.parametrize("judging", [(), ("--leak-check",)], ids=["tables", "tables-and-exits"])
def test_killing_leaktrace_at_any_moment_leaves_no_program_stopped(program, judging):
    """A shell starts sizes over and over while leaktrace --all is SIGKILLed at a random
    moment: the loop always ends (nothing stays held, for its tables or, with --leak-check,
    in _exit to be judged), in every round."""
    seed = int(os.environ.get("LEAKTRACE_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    chooser = random.Random(seed)
    binary = program("sizes")
    for _ in range(6):
        loop = subprocess.Popen(["setsid", "sh", "-c", f"for i in $(seq 400); do {binary} 64 128; done"])
        trace = SystemTrace("--comm", "^sizes$", *judging)
        time.sleep(chooser.uniform(0.0, 0.5))
        trace.process.kill()
        trace.process.wait()
        try:
            loop.wait(timeout=TIMEOUT)
        finally:
            left = stopped("sizes")
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            loop.kill()
        assert loop.returncode == 0 and not left, (seed, left)
