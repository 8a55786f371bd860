"""The one loop that drives a trace for every front end (the trace command's reports, the
agent's state, the top view): it polls the trace, hands a consumer a snapshot every interval
and one on SIGUSR2, and ends on SIGINT or SIGTERM, the target's exit, COUNT reports or the
consumer's word."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from leaktrace.errors import RuntimeFailure
from leaktrace.platform.pacing import poll_pause

from . import say

if TYPE_CHECKING:
    import argparse

    from leaktrace.model.snapshot import Snapshot
    from leaktrace.sources.protocol import TraceSource


class SnapshotConsumer(Protocol):
    """What the loop hands snapshots to: the trace command's outputs, the agent's state, the top view."""

    def report(self, snapshot: Snapshot) -> None: ...

    def dump_now(self, snapshot: Snapshot) -> None: ...


class SignalFlags:
    """SIGINT and SIGTERM ask the loop to stop; SIGUSR2 asks for a heap dump; SIGCHLD (a
    launched command stopped, for its tables at a dlopen, or exited) wakes the loop's wait at
    once instead of at its next poll."""

    def __init__(self) -> None:
        self.stop: int | None = None
        self.dump = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._stop)
        signal.signal(signal.SIGUSR2, self._dump)
        self._wakeup_read, wakeup_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wakeup_write, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)

    def wait(self, seconds: float) -> bool:
        """Sleeps up to seconds, or until a signal arrives; True (the loop goes on)."""
        if seconds > 0:
            select.select([self._wakeup_read], [], [], seconds)
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wakeup_read, 512):
                pass
        return True

    def _stop(self, signum, frame) -> None:
        self.stop = signum

    def _dump(self, signum, frame) -> None:
        self.dump = True

    def take_dump(self) -> bool:
        wanted, self.dump = self.dump, False
        return wanted


def next_report_time(last_due: float, interval: float, now: float) -> float:
    """When the next report is due: one interval after the last was due, or, when reports
    fell behind (a slow report under load), the next point of that grid after now: missed
    reports are skipped, never made in a burst."""
    due = last_due + interval
    if due <= now:
        due += ((now - due) // interval + 1) * interval
    return due


def snapshot_or_skip(trace: TraceSource, older_than_ms: int | None = None, **options) -> Snapshot | None:
    """A snapshot, or None with a line on stderr when the source has none to give (a
    preloaded program that did not dump in time)."""
    try:
        return trace.snapshot(older_than_ms, **options)
    except RuntimeFailure as e:
        say(f"report skipped: {e}")
        return None
    finally:  # e.g. the preload source's word on dump files it would not read
        for notice in trace.take_notices():
            say(notice)


def report_snapshot(trace: TraceSource, args: argparse.Namespace, last: bool = False, **options) -> Snapshot | None:
    """The snapshot of a report, with the reachability check when asked for and possible;
    the last report of a -p trace with --leak-check carries valgrind's kinds of the live heap."""
    snapshot = snapshot_or_skip(trace, args.older_than, **options)
    if snapshot is not None and last and args.leak_check not in (None, "no") and args.pid is not None:
        try:
            snapshot = dataclasses.replace(snapshot, leak_checks=(trace.check_leak_kinds(),))
        except RuntimeFailure as e:
            say(f"leak check skipped: {e}")
    if snapshot is None or not args.unreachable or trace.exited:
        return snapshot
    try:
        report = trace.check_unreachable() if args.limit is None else trace.check_unreachable(args.limit)
    except RuntimeFailure as e:
        say(f"reachability check skipped: {e}")
        return snapshot
    return dataclasses.replace(snapshot, unreachable=report)


@dataclass(frozen=True)
class ReportLoop:
    """How a front end's trace is driven: every interval a report, COUNT of them (0: until stopped)."""

    trace: TraceSource
    flags: SignalFlags
    interval: float
    count: int = 0
    take: Callable[[bool], Snapshot | None] | None = None  # a report's snapshot (True: the last of COUNT)

    @classmethod
    def of_arguments(cls, trace: TraceSource, args: argparse.Namespace, flags: SignalFlags) -> ReportLoop:
        """The loop the trace arguments ask for: INTERVAL, COUNT, and the checks a report carries."""
        return cls(trace, flags, args.interval, args.count or 0, lambda last: report_snapshot(trace, args, last))

    def report_to(self, consumer: SnapshotConsumer, last: bool = False) -> None:
        """One report now (none when the source has no snapshot to give)."""
        snapshot = self.take(last) if self.take else snapshot_or_skip(self.trace)
        if snapshot is not None:
            consumer.report(snapshot)

    def run(
        self, consumer: SnapshotConsumer, wait: Callable[[float], bool] | None = None, report_first: bool = False
    ) -> bool:
        """Reports every interval until stopped, the target is gone or wait (the consumer's
        pause between polls, for its input: flags.wait by default) returns False; True when
        COUNT reports were made."""
        wait = wait or self.flags.wait
        if report_first:
            self.report_to(consumer)
        reports = 0
        next_report = time.monotonic() + self.interval
        while self.flags.stop is None:
            polled_at = time.monotonic()
            if not self.trace.poll():
                break
            pause = poll_pause(time.monotonic() - polled_at)
            if self.flags.take_dump():
                snapshot = snapshot_or_skip(self.trace)
                if snapshot:
                    consumer.dump_now(snapshot)
            if time.monotonic() >= next_report:
                reports += 1
                self.report_to(consumer, last=bool(self.count) and reports >= self.count)
                if self.count and reports >= self.count:
                    return True
                next_report = next_report_time(next_report, self.interval, time.monotonic())
            if not wait(max(0.0, min(pause, next_report - time.monotonic()))):
                break
        return False
