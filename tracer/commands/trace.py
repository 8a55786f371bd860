"""`leaktrace -p PID | -c CMD [INTERVAL [COUNT]]`: periodic live-allocation reports."""
from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time

from ..bpf_engine import EngineSettings
from ..errors import UsageError
from ..malloc_options import OptionError, check_bpf_engine_options, parse_malloc_debug_options
from ..render_json import render_json
from ..render_text import render_text
from ..session import Trace
from ..symbolize import Symbolizer
from . import ArgumentParser, Command


def _bounded_int(low: int, high: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
        if value < low or (high is not None and value > high):
            bounds = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"{value} is out of range ({bounds})")
        return value
    return parse


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds") from None
    if not 0 < value < 1e9:
        raise argparse.ArgumentTypeError(f"interval must be more than 0 seconds, not {text}")
    return value


class _StopRequest:
    """Turns SIGINT and SIGTERM into a flag that the report loop reads."""

    def __init__(self):
        self.signal: int | None = None
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signal = signum


class TraceCommand(Command):
    name = "trace"
    help = "Trace the live heap of a process (-p) or a command (-c) and report what stays allocated."

    def prepare_parser(self, parser: ArgumentParser) -> None:
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("-p", "--pid", type=_bounded_int(1), help="trace this running process")
        target.add_argument("-c", "--command", help="run this command line, traced from its first allocation")
        parser.add_argument("interval", nargs="?", type=_interval, default=5.0,
                            help="seconds between reports (default 5)")
        parser.add_argument("count", nargs="?", type=_bounded_int(1), help="stop after this many reports")
        parser.add_argument("--top", type=_bounded_int(1), default=10, help="stacks per report (default 10)")
        parser.add_argument("--older-than", type=_bounded_int(0), metavar="MS",
                            help="only allocations older than MS milliseconds")
        parser.add_argument("--min-size", type=_bounded_int(1), help="smallest size that gets a stack")
        parser.add_argument("--max-size", type=_bounded_int(1), help="largest size that gets a stack")
        parser.add_argument("--options", default="", metavar="'OPT[=VAL] ...'",
                            help="malloc_debug options: backtrace[=N], backtrace_size=N, "
                                 "backtrace_min_size=N, backtrace_max_size=N")
        parser.add_argument("--frames", type=_bounded_int(1, 256), help="frames per stack (backtrace=N)")
        parser.add_argument("--json", action="store_true", help="one JSON object per report and line")
        parser.add_argument("--lib", metavar="PATH", help="probe this allocator library instead of the target's")
        defaults = EngineSettings()
        for flag, default, what in (("--max-live", defaults.max_live, "live allocations"),
                                    ("--max-sites", defaults.max_sites, "distinct (pid, stack, size) sites"),
                                    ("--max-stacks", defaults.max_stacks, "distinct stacks"),
                                    ("--max-pending", defaults.max_pending, "threads inside an allocator call")):
            parser.add_argument(flag, type=_bounded_int(1), default=default,
                                help=f"map capacity: {what} (default {default})")

    @staticmethod
    def settings(args: argparse.Namespace) -> EngineSettings:
        try:
            config = parse_malloc_debug_options(args.options)
            check_bpf_engine_options(config)
        except OptionError as e:
            raise UsageError(str(e).removeprefix("leaktrace: ")) from None
        size_min = args.min_size if args.min_size is not None else config.backtrace_min_size
        size_max = args.max_size if args.max_size is not None else config.backtrace_max_size
        if size_min > size_max:
            raise UsageError(f"the smallest size with a stack ({size_min}) is larger than the largest ({size_max})")
        return EngineSettings(stack_depth=args.frames or config.backtrace_frames, size_min=size_min,
                              size_max=size_max, max_live=args.max_live, max_sites=args.max_sites,
                              max_stacks=args.max_stacks, max_pending=args.max_pending)

    def run(self, args: argparse.Namespace) -> int:
        settings = self.settings(args)
        argv = None
        if args.command is not None:
            argv = shlex.split(args.command)
            if not argv:
                raise UsageError("-c needs a command")
        stop = _StopRequest()
        trace = Trace.launch(argv, settings, args.lib) if argv else Trace.attach(args.pid, settings, args.lib)
        with trace:
            what = f"command '{args.command}'" if argv else "pid"
            print(f"leaktrace: tracing {what} {trace.pid} through {trace.engine.library}: "
                  f"{len(trace.engine.probes)} probes live", file=sys.stderr, flush=True)
            symbolizer = Symbolizer()

            def emit(snapshot) -> None:
                symbolized = symbolizer.symbolize(snapshot)
                text = render_json(symbolized) if args.json else render_text(symbolized, args.top)
                sys.stdout.write(text)
                sys.stdout.flush()

            reports = 0
            next_report = time.monotonic() + args.interval
            while stop.signal is None and trace.poll():
                if time.monotonic() >= next_report:
                    emit(trace.snapshot(args.older_than))
                    reports += 1
                    if args.count and reports >= args.count:
                        return 0
                    next_report += args.interval
                time.sleep(0.02)
            if trace.exited:
                ending = (f"exited with status {trace.exit_status}" if trace.exit_status is not None
                          else "exited")
                print(f"leaktrace: {what} {trace.pid} {ending}", file=sys.stderr, flush=True)
            emit(trace.snapshot(args.older_than))
        return 0
