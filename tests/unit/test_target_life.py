"""The target's life as both engines see it (sources/target_life.py), on real processes: a
launched command's stop, its exit status or the signal that ended it, a command reaped
elsewhere, an attached process watched; and the leak check of a process held at its exit."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from leaktrace.errors import RuntimeFailure
from leaktrace.model.snapshot import LeakCheck
from leaktrace.sources.target import TraceTarget
from leaktrace.sources.target_life import TargetLife, TargetState, judged_at_exit, named_by_command_line


def settled(life: TargetLife, wanted: TargetState, stops: bool = False) -> TargetState:
    """The first state that is wanted, within 10 s."""
    deadline = time.monotonic() + 10
    state = life.look(stops)
    while state is not wanted and time.monotonic() < deadline:
        time.sleep(0.01)
        state = life.look(stops)
    return state


def test_a_command_s_stop_is_seen_when_asked_and_its_exit_status_kept():
    child = subprocess.Popen(["sh", "-c", "kill -STOP $$; exit 3"])
    life = TargetLife(TraceTarget.command(child.pid))
    assert settled(life, TargetState.STOPPED, stops=True) is TargetState.STOPPED
    assert life.look() is TargetState.RUNNING and not life.ended  # a stop not asked for is running
    os.kill(child.pid, signal.SIGCONT)
    assert settled(life, TargetState.ENDED) is TargetState.ENDED
    assert life.exit_status == 3 and life.ended and life.look() is TargetState.ENDED


def test_a_command_killed_by_a_signal_ends_with_its_negative_number():
    child = subprocess.Popen(["sleep", "30"])
    life = TargetLife(TraceTarget.command(child.pid))
    assert life.look() is TargetState.RUNNING
    child.kill()
    assert settled(life, TargetState.ENDED) is TargetState.ENDED and life.exit_status == -signal.SIGKILL


def test_a_command_reaped_elsewhere_ends_with_no_status():
    child = subprocess.Popen(["true"])
    child.wait()
    life = TargetLife(TraceTarget.command(child.pid))
    assert life.look() is TargetState.ENDED and life.exit_status is None


def test_an_attached_process_is_watched_until_it_is_gone():
    other = subprocess.Popen(["sleep", "30"])
    life = TargetLife(TraceTarget.process(other.pid))
    assert life.look() is TargetState.RUNNING
    other.kill()
    other.wait()
    assert life.look() is TargetState.ENDED and life.exit_status is None


def test_a_leak_check_at_exit_is_named_by_its_command_line_or_said_not_made():
    notices: list[str] = []
    [check] = judged_at_exit(os.getpid(), lambda: LeakCheck(os.getpid(), (), 0.0), notices)
    assert check.command.split()[0].endswith(("python", "python3", "python3.11")) and not notices

    def refused() -> LeakCheck:
        raise RuntimeFailure("pid 1 cannot be frozen")

    assert judged_at_exit(os.getpid(), refused, notices) == ()
    assert notices == ["leak check skipped: pid 1 cannot be frozen"]
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert named_by_command_line(LeakCheck(gone.pid, (), 0.0), gone.pid, "true").command == "true"
