"""`leaktrace -p PID | -c CMD [INTERVAL [COUNT]]`: periodic live-allocation reports."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import select
import signal
import sys
import time
from typing import TYPE_CHECKING, Protocol

from leaktrace.android.options import DEFAULT_DUMP_PREFIX, MallocDebugConfig
from leaktrace.errors import RuntimeFailure, UsageError
from leaktrace.outputs.files import FILE_FORMATS
from leaktrace.platform.pacing import poll_pause

from . import ArgumentParser, Command
from .engines import ENGINES
from .trace_arguments import (
    add_trace_arguments,
    check_combinations,
    check_output_paths,
    engine_settings,
    leak_check_settings,
    malloc_debug_config,
)

if TYPE_CHECKING:
    from leaktrace.analysis.suppressions import LeakCheckSettings
    from leaktrace.model.snapshot import Snapshot
    from leaktrace.sources.protocol import TraceSource

    from .outputs import Outputs


def ending_of(exit_status: int | None) -> str:
    """How a target ended, as its exit status says (None: not leaktrace's child, so unknown)."""
    if exit_status is None:
        return "exited"
    if exit_status < 0:
        try:
            name = signal.Signals(-exit_status).name
        except ValueError:
            name = f"signal {-exit_status}"
        return f"was killed by {name}"
    return f"exited with status {exit_status}"


def next_report_time(last_due: float, interval: float, now: float) -> float:
    """When the next report is due: one interval after the last was due, or, when reports
    fell behind (a slow report under load), the next point of that grid after now: missed
    reports are skipped, never made in a burst."""
    due = last_due + interval
    if due <= now:
        due += ((now - due) // interval + 1) * interval
    return due


def command_status(exit_status: int | None) -> int:
    """leaktrace's exit status for how a launched command ended, as a shell reports it: its
    own status, or 128 + N when signal N killed it (0 for a process leaktrace did not start)."""
    if exit_status is None:
        return 0
    return 128 - exit_status if exit_status < 0 else exit_status


class Reporter(Protocol):
    """What the report loop hands each snapshot to: the trace command's outputs, the agent's state."""

    def report(self, snapshot: Snapshot) -> None: ...

    def dump_now(self, snapshot: Snapshot) -> None: ...


class _SignalFlags:
    """SIGINT and SIGTERM ask the report loop to stop; SIGUSR2 asks for a heap dump; SIGCHLD
    (a launched command stopped, for its tables at a dlopen, or exited) wakes the loop's wait
    at once instead of at its next poll."""

    def __init__(self):
        self.stop: int | None = None
        self.dump = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._stop)
        signal.signal(signal.SIGUSR2, self._dump)
        self._wakeup_read, wakeup_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wakeup_write, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)

    def wait(self, seconds: float) -> None:
        """Sleeps up to seconds, or until a signal arrives."""
        if seconds > 0:
            select.select([self._wakeup_read], [], [], seconds)
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wakeup_read, 512):
                pass

    def _stop(self, signum, frame) -> None:
        self.stop = signum

    def _dump(self, signum, frame) -> None:
        self.dump = True

    def take_dump(self) -> bool:
        wanted, self.dump = self.dump, False
        return wanted


class TraceCommand(Command):
    name = "trace"
    help = "Trace the live heap of a process (-p) or a command (-c) and report what stays allocated."

    def prepare_parser(self, parser: ArgumentParser) -> None:
        add_trace_arguments(parser)

    @staticmethod
    def outputs(
        args: argparse.Namespace, config: MallocDebugConfig, leak_check: LeakCheckSettings | None, leak_log: bool
    ) -> Outputs:
        # The renderers load here, once the probes are live: they are not on the start-up path.
        from .outputs import Outputs

        return Outputs(
            json=args.json,
            top=args.top or (5 if args.all else 10),
            leak_info=args.leak_info,
            files={
                output.option: getattr(args, output.option) for output in FILE_FORMATS if getattr(args, output.option)
            },
            dump_prefix=args.heap_dump or str(config.values.get("backtrace_dump_prefix", DEFAULT_DUMP_PREFIX)),
            dump_each_report=args.heap_dump is not None,
            dump_on_exit=args.heap_dump_on_exit or "backtrace_dump_on_exit" in config.options,
            backtrace_full=args.backtrace_full or "backtrace_full" in config.options,
            leak_track=leak_log,
            systemwide=args.all,
            top_processes=args.top_processes or 10,
            min_bytes=args.min_bytes or 0,
            growth_intervals=args.growth_intervals,
            contents=args.contents,
            xml_file=args.xml_file,
            junit_file=args.junit,
            tool_argv=tuple(sys.argv),
            leak_check=leak_check,
            measure=args.measure,
        )

    @staticmethod
    def snapshot_or_skip(trace: TraceSource, older_than_ms: int | None = None, **options) -> Snapshot | None:
        """A snapshot, or None with a line on stderr when the source has none to give (a
        preloaded program that did not dump in time)."""
        try:
            return trace.snapshot(older_than_ms, **options)
        except RuntimeFailure as e:
            print(f"leaktrace: report skipped: {e}", file=sys.stderr, flush=True)
            return None
        finally:  # e.g. the preload source's word on dump files it would not read
            for notice in trace.take_notices():
                print(f"leaktrace: {notice}", file=sys.stderr, flush=True)

    @staticmethod
    def report_snapshot(trace: TraceSource, args: argparse.Namespace, last: bool = False, **options) -> Snapshot | None:
        """The snapshot of a report, with the reachability check when asked for and possible;
        the last report of a -p trace with --leak-check carries valgrind's kinds of the live heap."""
        snapshot = TraceCommand.snapshot_or_skip(trace, args.older_than, **options)
        if snapshot is not None and last and args.leak_check not in (None, "no") and args.pid is not None:
            try:
                snapshot = dataclasses.replace(snapshot, leak_checks=(trace.check_leak_kinds(),))
            except RuntimeFailure as e:
                print(f"leaktrace: leak check skipped: {e}", file=sys.stderr, flush=True)
        if snapshot is None or not args.unreachable or trace.exited:
            return snapshot
        try:
            report = trace.check_unreachable() if args.limit is None else trace.check_unreachable(args.limit)
        except RuntimeFailure as e:
            print(f"leaktrace: reachability check skipped: {e}", file=sys.stderr, flush=True)
            return snapshot
        return dataclasses.replace(snapshot, unreachable=report)

    @staticmethod
    def report_loop(trace: TraceSource, args: argparse.Namespace, outputs: Reporter, flags: _SignalFlags) -> bool:
        """Reports every interval until stopped or the target is gone; True when COUNT reports were made."""
        reports = 0
        next_report = time.monotonic() + args.interval
        while flags.stop is None:
            polled_at = time.monotonic()
            if not trace.poll():
                break
            pause = poll_pause(time.monotonic() - polled_at)
            if flags.take_dump():
                snapshot = TraceCommand.snapshot_or_skip(trace)
                if snapshot:
                    outputs.dump_now(snapshot)
            if time.monotonic() >= next_report:
                last = bool(args.count) and reports + 1 >= args.count
                snapshot = TraceCommand.report_snapshot(trace, args, last)
                if snapshot:
                    outputs.report(snapshot)
                reports += 1
                if args.count and reports >= args.count:
                    return True
                next_report = next_report_time(next_report, args.interval, time.monotonic())
            flags.wait(min(pause, next_report - time.monotonic()))
        return False

    def run(self, args: argparse.Namespace) -> int:
        config = malloc_debug_config(args)
        settings = engine_settings(args, config)
        if args.preload_lib:
            from leaktrace.sources.preload.trace import preload_library

            print(preload_library())
            return 0
        check_combinations(args, ENGINES[args.engine])
        check_output_paths(args, config)
        leak_check = leak_check_settings(args)  # its suppression files read before anything starts
        engine = ENGINES[args.engine]
        # The leak log at a process's exit: leaktrace's, unless the target's own library writes it.
        leak_log = (args.leak_track or "leak_track" in config.options) and not engine.logs_own_leaks
        settings = dataclasses.replace(settings, leak_check_at_exit=leak_check is not None, exit_allocations=leak_log)
        if args.top_view and not (sys.stdin.isatty() and sys.stdout.isatty()):
            raise UsageError(
                "--top-view needs a terminal on standard input and output; without one, drop it for reports"
            )
        flags = _SignalFlags()
        trace, what = engine.start(args, settings, config)
        with trace:
            for line in trace.startup_lines(what, args.verbose):
                print(f"leaktrace: {line}", file=sys.stderr, flush=True)
            outputs = self.outputs(args, config, leak_check, leak_log)
            if args.top_view:
                from leaktrace.outputs.top_view import run_top_view

                run_top_view(trace, args.interval, flags, args.growth_intervals)
            elif self.report_loop(trace, args, outputs, flags):
                self.leave_command(trace, args, what)
                self.say_leaking(outputs)
                return outputs.exit_status()
            final = self.report_snapshot(trace, args, last=True, with_allocations=trace.exited and leak_log)
            if final:
                outputs.report(final)
            self.say_leaking(outputs)
            unjudged = self.unjudged_command(trace, args, outputs, what)
            if trace.exited:  # the last line: how the target ended
                print(f"leaktrace: {what} {ending_of(trace.exit_status)}", file=sys.stderr, flush=True)
            self.leave_command(trace, args, what)
        if unjudged:
            return unjudged
        return outputs.exit_status() or command_status(trace.exit_status if trace.exited else None)

    @staticmethod
    def unjudged_command(trace: TraceSource, args: argparse.Namespace, outputs: Outputs, what: str) -> int:
        """A gate never passes a command it did not judge: with --leak-check, a -c command that
        exited (not killed by a signal) without a leak check is said in one line, and the run
        ends with --error-exitcode's N (1 without one). 0 when there is nothing to say."""
        settings = outputs.leak_check
        if settings is None or not args.command or not trace.exited or (trace.exit_status or 0) < 0:
            return 0
        if trace.pid in outputs.judged or not trace.target_selected:
            return 0
        why = f"exited without being judged ({trace.unjudged_why})"
        print(f"leaktrace: leak check: {what} {why}: failing the run", file=sys.stderr, flush=True)
        outputs.note_unjudged(what, why)
        return settings.error_exitcode or 1

    @staticmethod
    def say_leaking(outputs: Outputs) -> None:
        for line in outputs.leaking_lines():
            print(f"leaktrace: {line}", file=sys.stderr, flush=True)

    @staticmethod
    def leave_command(trace: TraceSource, args: argparse.Namespace, what: str) -> None:
        """A -c command still running as the trace ends (COUNT reports, Ctrl-C, q): killed with
        --kill-on-exit, else left running; either way said in one line."""
        if not trace.is_child or trace.exited:
            return
        if args.kill_on_exit:
            with contextlib.suppress(ProcessLookupError):
                os.kill(trace.pid, signal.SIGKILL)
            print(f"leaktrace: {what} killed (--kill-on-exit)", file=sys.stderr, flush=True)
        else:
            print(
                f"leaktrace: {what} left running (--kill-on-exit ends it with the trace)", file=sys.stderr, flush=True
            )
