"""What both engines do alike with their target's life: whether it still runs, and how it
ended (a launched command is leaktrace's child, reaped here with its exit status kept; an
attached process is watched through /proc), and the leak check of a process held at its
exit, named by its command line or said not made."""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Callable

from leaktrace.errors import RuntimeFailure
from leaktrace.model.snapshot import LeakCheck
from leaktrace.platform.process import alive, command_line
from leaktrace.sources.target import TraceTarget


class TargetState(enum.Enum):
    RUNNING = "running"
    STOPPED = "stopped"  # a launched command in a stop (looked for only when asked)
    ENDED = "ended"


class TargetLife:
    """One process's life as a trace sees it: exit_status once a launched command has ended
    (None: attached, or reaped elsewhere)."""

    def __init__(self, target: TraceTarget) -> None:
        self.target = target
        self.exit_status: int | None = None
        self.ended = False

    def look(self, stops: bool = False) -> TargetState:
        """Its state now; with stops, a launched command's stop is returned (it stays stopped)."""
        if self.ended:
            return TargetState.ENDED
        pid = self.target.single_pid
        if not self.target.is_command:
            self.ended = not alive(pid)
            return TargetState.ENDED if self.ended else TargetState.RUNNING
        try:
            found, status = os.waitpid(pid, os.WNOHANG | (os.WUNTRACED if stops else 0))
        except ChildProcessError:  # reaped elsewhere (the API user waited for it): no status
            self.ended = True
            return TargetState.ENDED
        if found == 0:
            return TargetState.RUNNING
        if os.WIFSTOPPED(status):
            return TargetState.STOPPED
        self.exit_status, self.ended = os.waitstatus_to_exitcode(status), True
        return TargetState.ENDED


def named_by_command_line(check: LeakCheck, pid: int, otherwise: str = "") -> LeakCheck:
    """A leak check named by its process's command line (else otherwise, else the name it has)."""
    return dataclasses.replace(check, command=command_line(pid) or otherwise or check.command)


def judged_at_exit(pid: int, judge: Callable[[], LeakCheck], notices: list[str]) -> tuple[LeakCheck, ...]:
    """valgrind's kinds of a process held at its exit, named by its command line; none, said
    in a notice, where it cannot be judged."""
    try:
        check = judge()
    except RuntimeFailure as e:
        notices.append(f"leak check skipped: {e}")
        return ()
    return (named_by_command_line(check, pid),)
