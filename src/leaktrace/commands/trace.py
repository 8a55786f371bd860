"""`leaktrace -p PID | -c CMD [INTERVAL [COUNT]]`: periodic live-allocation reports."""

from __future__ import annotations

import argparse
import dataclasses
import pwd
import re
import shlex
import signal
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from leaktrace.android.options import (
    DEFAULT_DUMP_PREFIX,
    SIZE_MAX,
    MallocDebugConfig,
    OptionError,
    check_engine_options,
    parse_malloc_debug_options,
)
from leaktrace.errors import RuntimeFailure, UsageError
from leaktrace.platform.pacing import poll_pause
from leaktrace.platform.system import check_system
from leaktrace.sources.bpf.compile import EngineSettings, compile_ahead, discard_compile_ahead

from . import ArgumentParser, Command

if TYPE_CHECKING:
    from collections.abc import Callable

    from leaktrace.model.snapshot import Snapshot
    from leaktrace.sources.protocol import TraceSource

    from .outputs import Outputs


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


def _pid_list(text: str) -> frozenset[int]:
    parse = _bounded_int(1)
    return frozenset(parse(part) for part in text.split(",") if part.strip())


def _regex(text: str) -> re.Pattern:
    try:
        return re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"'{text}' is not a regular expression ({e})") from None


def _uid(text: str) -> int:
    if text.isdigit():
        return int(text)
    try:
        return pwd.getpwnam(text).pw_uid
    except KeyError:
        raise argparse.ArgumentTypeError(f"no user named '{text}'") from None


# Options that only a systemwide trace (--all) takes.
_SYSTEMWIDE_ONLY = ("pid_filter", "comm", "uid", "min_bytes", "top_processes")


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds") from None
    if not 0 < value < 1e9:
        raise argparse.ArgumentTypeError(f"interval must be more than 0 seconds, not {text}")
    return value


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


class _SignalFlags:
    """SIGINT and SIGTERM ask the report loop to stop; SIGUSR2 asks for a heap dump."""

    def __init__(self):
        self.stop: int | None = None
        self.dump = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._stop)
        signal.signal(signal.SIGUSR2, self._dump)

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
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("-p", "--pid", type=_bounded_int(1), help="trace this running process")
        target.add_argument("-c", "--command", help="run this command line, traced from its first allocation")
        target.add_argument(
            "-a",
            "--all",
            action="store_true",
            help="trace every process that uses a libc of this system (and --lib), each from its first allocator call",
        )
        target.add_argument(
            "--preload-lib",
            action="store_true",
            help="print the path of leaktrace's LD_PRELOAD library (malloc_debug's API for glibc programs) and exit",
        )
        parser.add_argument(
            "interval", nargs="?", type=_interval, default=5.0, help="seconds between reports (default 5)"
        )
        parser.add_argument("count", nargs="?", type=_bounded_int(1), help="stop after this many reports")
        parser.add_argument(
            "--top", type=_bounded_int(1), help="stacks per report (default 10), or per process with --all (default 5)"
        )
        parser.add_argument(
            "--top-view",
            action="store_true",
            help="a full-screen live view like top instead of reports (keys: h for help)",
        )
        parser.add_argument(
            "--growth-intervals",
            type=_bounded_int(1),
            default=3,
            metavar="N",
            help="a stack whose live bytes rose in each of the last N intervals is flagged "
            "as a likely leak (default 3)",
        )
        parser.add_argument("--pid-filter", type=_pid_list, metavar="PID[,PID...]", help="--all: only these processes")
        parser.add_argument(
            "--comm",
            type=_regex,
            metavar="REGEX",
            help="--all: only processes whose comm (15 characters) matches REGEX",
        )
        parser.add_argument("--uid", type=_uid, metavar="UID|USER", help="--all: only processes of this real uid")
        parser.add_argument(
            "--min-bytes",
            type=_bounded_int(0),
            metavar="N",
            help="--all: leave processes holding fewer than N live bytes out of the report",
        )
        parser.add_argument(
            "--top-processes", type=_bounded_int(1), metavar="N", help="--all: processes per report (default 10)"
        )
        parser.add_argument(
            "--older-than", type=_bounded_int(0), metavar="MS", help="only allocations older than MS milliseconds"
        )
        parser.add_argument("--min-size", type=_bounded_int(1), help="smallest size that gets a stack")
        parser.add_argument("--max-size", type=_bounded_int(1), help="largest size that gets a stack")
        parser.add_argument(
            "--options",
            default="",
            metavar="'OPT[=VAL] ...'",
            help="malloc_debug options: backtrace[=N], backtrace_size=N, "
            "backtrace_min_size=N, backtrace_max_size=N, backtrace_dump_on_exit, "
            "backtrace_dump_prefix=P, backtrace_full, leak_track; with --engine "
            "preload also backtrace_enable_on_signal, guard, front_guard, rear_guard, "
            "fill, fill_on_alloc, fill_on_free, expand_alloc, free_track, "
            "free_track_backtrace_num_frames, verify_pointers, abort_on_error",
        )
        parser.add_argument("--frames", type=_bounded_int(1, 256), help="frames per stack (backtrace=N)")
        parser.add_argument(
            "--unwind",
            choices=("dwarf", "fp"),
            default="dwarf",
            help="BPF engine stacks: dwarf follows each module's .eh_frame (default; right "
            "without frame pointers); fp follows the frame-pointer chain only",
        )
        parser.add_argument("--json", action="store_true", help="one JSON object per report and line")
        parser.add_argument(
            "--leak-info", metavar="FILE", help="write get_malloc_leak_info's raw buffer (64-bit ABI) at each report"
        )
        parser.add_argument(
            "--pprof",
            metavar="FILE",
            help="write each report as a gzip'd pprof profile (go tool pprof, Pyroscope, Parca)",
        )
        parser.add_argument(
            "--folded",
            metavar="FILE",
            help="write each report as collapsed stacks (flamegraph.pl, inferno, speedscope)",
        )
        parser.add_argument(
            "--html", metavar="FILE", help="write each report as one self-contained HTML page with a flame graph"
        )
        parser.add_argument(
            "--heap-dump",
            metavar="PREFIX",
            help="write an Android v1.2 heap dump to PREFIX.PID.txt at each report and on SIGUSR2",
        )
        parser.add_argument(
            "--heap-dump-on-exit",
            action="store_true",
            help="write PREFIX.PID.exit.txt when the target exits (backtrace_dump_on_exit)",
        )
        parser.add_argument(
            "--backtrace-full", action="store_true", help="add bt_info lines to heap dumps (backtrace_full)"
        )
        parser.add_argument(
            "--leak-track",
            action="store_true",
            help="log every live allocation on stderr when the target exits (leak_track)",
        )
        parser.add_argument(
            "--engine",
            choices=("bpf", "preload"),
            default="bpf",
            help="bpf: uprobes (default); preload: run -c's command with leaktrace's LD_PRELOAD "
            "library, which records in the process and dumps on request",
        )
        parser.add_argument(
            "--unreachable",
            action="store_true",
            help="at each report while the target lives, freeze it a moment and find the "
            "allocations nothing reachable points to (libmemunreachable's check)",
        )
        parser.add_argument(
            "--contents", action="store_true", help="--unreachable: show the first 32 bytes of each leak"
        )
        parser.add_argument(
            "--limit", type=_bounded_int(0), metavar="N", help="--unreachable: leaks shown (default 100)"
        )
        parser.add_argument(
            "-f",
            "--follow-forks",
            action="store_true",
            help="trace child processes too, with the blocks they inherit (their own carry the zygote bit); "
            "the probes then trap in every process that uses the library",
        )
        parser.add_argument("-v", "--verbose", action="store_true", help="say where each probe went and why (stderr)")
        parser.add_argument(
            "--lib",
            metavar="PATH",
            action="append",
            help="probe this allocator library instead of the target's; with --all, in "
            "addition to every libc (repeatable)",
        )
        defaults = EngineSettings()
        for flag, default, what in (
            ("--max-live", defaults.max_live, "live allocations"),
            ("--max-sites", defaults.max_sites, "distinct (pid, stack, size) sites"),
            ("--max-stacks", defaults.max_stacks, "distinct stacks"),
        ):
            parser.add_argument(
                flag, type=_bounded_int(1), default=default, help=f"map capacity: {what} (default {default})"
            )

    @staticmethod
    def config(args: argparse.Namespace) -> MallocDebugConfig:
        try:
            config = parse_malloc_debug_options(args.options)
            check_engine_options(config, args.engine)
        except OptionError as e:
            raise UsageError(str(e).removeprefix("leaktrace: ")) from None
        return config

    @staticmethod
    def outputs(args: argparse.Namespace, config: MallocDebugConfig) -> Outputs:
        # The renderers load here, once the probes are live: they are not on the start-up path.
        from .outputs import Outputs

        return Outputs(
            json=args.json,
            top=args.top or (5 if args.all else 10),
            leak_info=args.leak_info,
            pprof=args.pprof,
            folded=args.folded,
            html=args.html,
            dump_prefix=args.heap_dump or str(config.values.get("backtrace_dump_prefix", DEFAULT_DUMP_PREFIX)),
            dump_each_report=args.heap_dump is not None,
            dump_on_exit=args.heap_dump_on_exit or "backtrace_dump_on_exit" in config.options,
            backtrace_full=args.backtrace_full or "backtrace_full" in config.options,
            leak_track=args.leak_track or "leak_track" in config.options,
            systemwide=args.all,
            top_processes=args.top_processes or 10,
            min_bytes=args.min_bytes or 0,
            growth_intervals=args.growth_intervals,
            contents=args.contents,
        )

    @staticmethod
    def settings(args: argparse.Namespace, config: MallocDebugConfig) -> EngineSettings:
        size_min = args.min_size if args.min_size is not None else config.backtrace_min_size
        size_max = args.max_size if args.max_size is not None else config.backtrace_max_size
        if size_min > size_max:
            raise UsageError(f"the smallest size with a stack ({size_min}) is larger than the largest ({size_max})")
        return EngineSettings(
            stack_depth=args.frames or config.backtrace_frames,
            size_min=size_min,
            size_max=size_max,
            max_live=args.max_live,
            max_sites=args.max_sites,
            max_stacks=args.max_stacks,
            follow_forks=args.follow_forks,
            unwind=args.unwind,
        )

    @staticmethod
    def check_combinations(args: argparse.Namespace) -> None:
        """Refuses options that do not go together, before anything starts."""
        engine = ENGINES[args.engine]
        if args.all:
            if args.unreachable:
                raise UsageError("--unreachable checks one process: use -p or -c, not --all")
            if not engine.traces_every_process:
                raise UsageError(f"--engine {args.engine} traces one process: use -c or -p")
            return
        given = [f"--{name.replace('_', '-')}" for name in _SYSTEMWIDE_ONLY if getattr(args, name) is not None]
        if given:
            raise UsageError(f"{given[0]} needs --all")
        if args.unreachable and args.top_view:
            raise UsageError("--unreachable reports in text or JSON, not in the top view")
        if (args.contents or args.limit is not None) and not args.unreachable:
            raise UsageError(f"{'--contents' if args.contents else '--limit'} needs --unreachable")
        if args.lib and len(args.lib) > 1:
            raise UsageError("--lib is given once, except with --all")
        for flag, name in engine.refuses:
            if getattr(args, name) not in (None, False):
                raise UsageError(f"{flag} works with the BPF engine only")

    @staticmethod
    def command_argv(args: argparse.Namespace) -> list[str]:
        argv = shlex.split(args.command)
        if not argv:
            raise UsageError("-c needs a command")
        return argv

    @staticmethod
    def start_preload(
        args: argparse.Namespace, settings: EngineSettings, config: MallocDebugConfig
    ) -> tuple[TraceSource, str]:
        """--engine preload: -c's command run with the library, told the same options; or -p's
        process, started with the library elsewhere, asked for dumps."""
        from leaktrace.sources.preload.trace import PreloadTrace

        if args.pid is not None:
            return PreloadTrace.attach(args.pid), f"pid {args.pid}"
        argv = TraceCommand.command_argv(args)
        # The user's string (allocator-side options included), then what the flags decided: last wins.
        stacks = (
            "backtrace_enable_on_signal"
            if "backtrace_enable_on_signal" in config.options and "backtrace" not in config.options
            else "backtrace"
        )
        options = [args.options, f"{stacks}={settings.stack_depth}"]
        options += [f"backtrace_min_size={settings.size_min}"] if settings.size_min else []
        options += [f"backtrace_max_size={settings.size_max}"] if settings.size_max != SIZE_MAX else []
        options += ["leak_track"] if args.leak_track else []
        trace = PreloadTrace.launch(argv, " ".join(option for option in options if option))
        return trace, f"command '{args.command}' {trace.pid}"

    @staticmethod
    def start_bpf(
        args: argparse.Namespace, settings: EngineSettings, config: MallocDebugConfig
    ) -> tuple[TraceSource, str]:
        """The trace the arguments ask for, and how to name its target."""
        check_system()
        if args.command is None:
            # The target is known: clang starts before the rest of leaktrace loads and the
            # target is looked at. (-c's pid exists only once its command is spawned.)
            compile_ahead(settings, 0 if args.all else args.pid)
        try:
            from leaktrace.sources.bpf.trace import Selection, Trace

            if args.all:
                selection = Selection(args.pid_filter or frozenset(), args.comm, args.uid)
                return Trace.everything(settings, tuple(args.lib or ()), selection), "every process"
            library = args.lib[0] if args.lib else None
            if args.command is None:
                return Trace.attach(args.pid, settings, library), f"pid {args.pid}"
            trace = Trace.launch(TraceCommand.command_argv(args), settings, library)
            return trace, f"command '{args.command}' {trace.pid}"
        except BaseException:
            discard_compile_ahead()  # fds 1 and 2 are the compile's log until it ends: the error waits for it
            raise

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
    def report_snapshot(trace: TraceSource, args: argparse.Namespace, **options) -> Snapshot | None:
        """The snapshot of a report, with the reachability check when asked for and possible."""
        snapshot = TraceCommand.snapshot_or_skip(trace, args.older_than, **options)
        if snapshot is None or not args.unreachable or trace.exited:
            return snapshot
        try:
            report = trace.check_unreachable() if args.limit is None else trace.check_unreachable(args.limit)
        except RuntimeFailure as e:
            print(f"leaktrace: reachability check skipped: {e}", file=sys.stderr, flush=True)
            return snapshot
        return dataclasses.replace(snapshot, unreachable=report)

    @staticmethod
    def report_loop(trace: TraceSource, args: argparse.Namespace, outputs: Outputs, flags: _SignalFlags) -> bool:
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
                snapshot = TraceCommand.report_snapshot(trace, args)
                if snapshot:
                    outputs.report(snapshot)
                reports += 1
                if args.count and reports >= args.count:
                    return True
                next_report += args.interval
            time.sleep(max(0.0, min(pause, next_report - time.monotonic())))
        return False

    def run(self, args: argparse.Namespace) -> int:
        config = self.config(args)
        settings = self.settings(args, config)
        if args.preload_lib:
            from leaktrace.sources.preload.trace import preload_library

            print(preload_library())
            return 0
        self.check_combinations(args)
        flags = _SignalFlags()
        trace, what = ENGINES[args.engine].start(args, settings, config)
        with trace:
            for line in trace.startup_lines(what, args.verbose):
                print(f"leaktrace: {line}", file=sys.stderr, flush=True)
            outputs = self.outputs(args, config)
            if trace.logs_own_leaks:
                outputs.leak_track = False
            trace.final_with_allocations = outputs.wants_exit_allocations
            if args.top_view:
                from leaktrace.outputs.top_view import run_top_view

                run_top_view(trace, args.interval, flags, args.growth_intervals)
            elif self.report_loop(trace, args, outputs, flags):
                return outputs.exit_status()
            final = self.report_snapshot(trace, args, with_allocations=trace.exited and outputs.wants_exit_allocations)
            if final:
                outputs.report(final)
            if trace.exited:  # the last line: how the target ended
                print(f"leaktrace: {what} {ending_of(trace.exit_status)}", file=sys.stderr, flush=True)
        return outputs.exit_status()


@dataclass(frozen=True)
class Engine:
    """How the trace command starts one engine, and what it cannot do."""

    start: Callable[[argparse.Namespace, EngineSettings, MallocDebugConfig], tuple[TraceSource, str]]
    traces_every_process: bool
    refuses: tuple[tuple[str, str], ...] = ()  # (flag, argparse name) the engine has no use for


ENGINES = {
    "bpf": Engine(TraceCommand.start_bpf, traces_every_process=True),
    "preload": Engine(
        TraceCommand.start_preload,
        traces_every_process=False,
        refuses=(("--older-than", "older_than"), ("-f", "follow_forks"), ("--lib", "lib")),
    ),
}
