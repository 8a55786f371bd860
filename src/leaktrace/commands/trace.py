"""`leaktrace -p PID | -c CMD [INTERVAL [COUNT]]`: periodic live-allocation reports."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import sys
from typing import TYPE_CHECKING

from leaktrace.android.options import DEFAULT_DUMP_PREFIX, MallocDebugConfig
from leaktrace.errors import UsageError
from leaktrace.outputs.renderers import RENDERERS

from . import ArgumentParser, Command, say
from .engines import ENGINES
from .report_loop import ReportLoop, SignalFlags, report_snapshot
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


def command_status(exit_status: int | None) -> int:
    """leaktrace's exit status for how a launched command ended, as a shell reports it: its
    own status, or 128 + N when signal N killed it (0 for a process leaktrace did not start)."""
    if exit_status is None:
        return 0
    return 128 - exit_status if exit_status < 0 else exit_status


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
        from .outputs import AndroidFiles, LeakGate, OutputFiles, Outputs, Reports

        files = OutputFiles()
        reports = Reports(
            stdout=RENDERERS.json if args.json else RENDERERS.processes if args.all else RENDERERS.text,
            files={
                output.name: getattr(args, output.name)
                for output in RENDERERS.file_formats()
                if getattr(args, output.name)
            },
            top=args.top or (5 if args.all else 10),
            top_processes=args.top_processes or 10,
            min_bytes=args.min_bytes or 0,
            contents=args.contents,
            measure=args.measure,
        )
        android = AndroidFiles(
            leak_info=args.leak_info,
            dump_prefix=args.heap_dump or str(config.values.get("backtrace_dump_prefix", DEFAULT_DUMP_PREFIX)),
            dump_each_report=args.heap_dump is not None,
            dump_on_exit=args.heap_dump_on_exit or "backtrace_dump_on_exit" in config.options,
            backtrace_full=args.backtrace_full or "backtrace_full" in config.options,
            leak_track=leak_log,
            per_process_leak_info=args.all,
        )
        gate = LeakGate(leak_check, files, args.xml_file, args.junit, tuple(sys.argv)) if leak_check else None
        return Outputs(reports, android, files, gate, args.growth_intervals)

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
        flags = SignalFlags()
        trace, what = engine.start(args, settings, config)
        with trace:
            for line in trace.startup_lines(what, args.verbose):
                say(line)
            outputs = self.outputs(args, config, leak_check, leak_log)
            loop = ReportLoop.of_arguments(trace, args, flags)
            if args.top_view:
                from leaktrace.outputs.top_view import run_top_view

                run_top_view(loop.run, args.interval, outputs.dump_now, args.growth_intervals)
            elif loop.run(outputs):
                self.say_leaking(outputs)
                unjudged = self.unjudged_command(
                    trace, args, outputs, what, f"after {args.count} report{'s' * (args.count != 1)}"
                )
                self.leave_command(trace, args, what)
                return unjudged or outputs.exit_status()
            final = report_snapshot(trace, args, last=True, with_allocations=trace.exited and leak_log)
            if final:
                outputs.report(final)
            self.say_leaking(outputs)
            unjudged = self.unjudged_command(trace, args, outputs, what, "when the trace was stopped")
            if trace.exited:  # the last line: how the target ended
                say(f"{what} {ending_of(trace.exit_status)}")
            self.leave_command(trace, args, what)
        if unjudged:
            return unjudged
        return outputs.exit_status() or command_status(trace.exit_status if trace.exited else None)

    @staticmethod
    def unjudged_command(trace: TraceSource, args: argparse.Namespace, outputs: Outputs, what: str, ended: str) -> int:
        """A gate never passes a command it did not judge: with --leak-check, a -c command that
        exited (not killed by a signal) without a leak check, or that still ran when the trace
        ended (ended: when), is said in one line, and the run ends with --error-exitcode's N (1
        without one). 0 when there is nothing to say."""
        gate = outputs.gate
        if gate is None or not args.command or (trace.exited and (trace.exit_status or 0) < 0):
            return 0
        if trace.pid in gate.judged or not trace.target_selected:
            return 0
        if trace.exited:
            why = f"exited without being judged ({trace.unjudged_why})"
        else:
            why = f"was still running {ended}, and a command is judged at its exit"
        say(f"leak check: {what} {why}: failing the run")
        gate.note_unjudged(what, why)
        return gate.settings.error_exitcode or 1

    @staticmethod
    def say_leaking(outputs: Outputs) -> None:
        for line in outputs.leaking_lines():
            say(line)

    @staticmethod
    def leave_command(trace: TraceSource, args: argparse.Namespace, what: str) -> None:
        """A -c command still running as the trace ends (COUNT reports, Ctrl-C, q): killed with
        --kill-on-exit, else left running; either way said in one line."""
        if not trace.target.is_command or trace.exited:
            return
        if args.kill_on_exit:
            with contextlib.suppress(ProcessLookupError):
                os.kill(trace.target.single_pid, signal.SIGKILL)
            say(f"{what} killed (--kill-on-exit)")
        else:
            say(f"{what} left running (--kill-on-exit ends it with the trace)")
