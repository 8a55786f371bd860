"""The trace command's arguments: their parser, their types, and what they make (the
malloc_debug options, the engine's settings), with the combinations refused before
anything starts."""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import re
import shlex
from typing import TYPE_CHECKING

from leaktrace.android.options import (
    ALLOCATOR_ONLY,
    DEFAULT_DUMP_PREFIX,
    MallocDebugConfig,
    OptionError,
    check_engine_options,
    parse_malloc_debug_options,
)
from leaktrace.errors import RuntimeFailure, UsageError
from leaktrace.interpreters.table import may_hold_interpreter
from leaktrace.model.snapshot import Measure
from leaktrace.outputs.renderers import RENDERERS
from leaktrace.platform.arch import HOST
from leaktrace.platform.atomic_write import not_replaceable
from leaktrace.platform.containers import ID_PREFIX
from leaktrace.platform.process import program_behind, resolve_executable
from leaktrace.sources.sampling import EXACT, Sampling, parse_size, random_seed
from leaktrace.sources.settings import EngineSettings

from . import ArgumentParser, bounded_int

if TYPE_CHECKING:
    from leaktrace.analysis.suppressions import LeakCheckSettings

    from .engines import Engine


def _pid_list(text: str) -> frozenset[int]:
    parse = bounded_int(1)
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


MAP_CAPACITY_LIMIT = 1 << 26  # entries in one BPF map: more is refused as a usage error, not by the kernel
# Options that only a systemwide trace (--all) takes; and the choice of processes, which -f takes too.
_SYSTEMWIDE_ONLY = ("pid_filter", "min_bytes", "top_processes", "container")
_SELECTION = ("comm", "exe", "uid")


def _container_prefix(text: str) -> str:
    if not ID_PREFIX.fullmatch(text):
        raise argparse.ArgumentTypeError(f"'{text[:80]}' is not a container id (hex digits, as podman ps prints)")
    return text


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds") from None
    if not 0 < value < 1e9:
        raise argparse.ArgumentTypeError(f"interval must be more than 0 seconds, not {text}")
    return value


def _add_target(parser: ArgumentParser) -> None:
    """What to trace, how often and how many times."""
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("-p", "--pid", type=bounded_int(1), help="trace this running process")
    target.add_argument(
        "-c",
        "--command",
        help="run this command line, traced from its first allocation; or give the program and its "
        "arguments last, after --, as to valgrind (leaktrace [options] -- PROGRAM ARGS)",
    )
    parser.program_options = ("-c", "--command")
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
    parser.add_argument("interval", nargs="?", type=_interval, default=5.0, help="seconds between reports (default 5)")
    parser.add_argument("count", nargs="?", type=bounded_int(1), help="stop after this many reports")


def _add_report_view(parser: ArgumentParser) -> None:
    """How much of each report, and the live view."""
    parser.add_argument(
        "--top", type=bounded_int(1), help="stacks per report (default 10), or per process with --all (default 5)"
    )
    parser.add_argument(
        "--measure",
        type=Measure,
        choices=list(Measure),
        default=Measure.LIVE,
        help="what the text table, --folded, --html and --pprof's default sample type are drawn by: bytes live now "
        "(default), allocated since the trace began, live at each process's peak, or short-lived blocks (freed by "
        "their thread's next allocator call)",
    )
    parser.add_argument(
        "--top-view",
        action="store_true",
        help="a full-screen live view like top instead of reports (keys: h for help)",
    )
    parser.add_argument(
        "--growth-intervals",
        type=bounded_int(1),
        default=3,
        metavar="N",
        help="a stack whose live bytes rose in each of the last N intervals is flagged as a likely leak (default 3)",
    )


def _add_process_selection(parser: ArgumentParser) -> None:
    """--all's choice of processes, and of those in its report."""
    parser.add_argument("--pid-filter", type=_pid_list, metavar="PID[,PID...]", help="--all: only these processes")
    parser.add_argument(
        "--comm",
        type=_regex,
        metavar="REGEX",
        help="--all, -f: only processes whose comm (15 characters) matches REGEX (with -f, the command too)",
    )
    parser.add_argument(
        "--exe",
        metavar="GLOB",
        help="--all, -f: only processes whose executable's path, or name, matches GLOB",
    )
    parser.add_argument("--uid", type=_uid, metavar="UID|USER", help="--all, -f: only processes of this real uid")
    parser.add_argument(
        "--container",
        type=_container_prefix,
        metavar="ID",
        help="--all: only the processes of the container whose id begins with ID (as podman ps or docker ps "
        "print it), chosen in the kernel by its pid namespace",
    )
    parser.add_argument(
        "--min-bytes",
        type=bounded_int(0),
        metavar="N",
        help="--all: leave processes holding fewer than N live bytes out of the report",
    )
    parser.add_argument(
        "--top-processes", type=bounded_int(1), metavar="N", help="--all: processes per report (default 10)"
    )


def _add_stack_choices(parser: ArgumentParser) -> None:
    """Which allocations get a stack, and how it is taken."""
    parser.add_argument(
        "--older-than", type=bounded_int(0), metavar="MS", help="only allocations older than MS milliseconds"
    )
    parser.add_argument("--min-size", type=bounded_int(1), help="smallest size that gets a stack")
    parser.add_argument("--max-size", type=bounded_int(1), help="largest size that gets a stack")
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
    parser.add_argument("--frames", type=bounded_int(1, 256), help="frames per stack (backtrace=N)")
    parser.add_argument(
        "--unwind",
        choices=("dwarf", "fp"),
        default="dwarf" if HOST.rows_walk else "fp",
        help="BPF engine stacks: dwarf follows each module's .eh_frame (default; right "
        "without frame pointers); fp follows the frame-pointer chain only (the default on "
        "machines whose frames the walk's rows do not describe: arm64)",
    )


def _add_outputs(parser: ArgumentParser) -> None:
    """What each report writes, and where."""
    parser.add_argument("--json", action="store_true", help="one JSON object per report and line")
    parser.add_argument(
        "--leak-info", metavar="FILE", help="write get_malloc_leak_info's raw buffer (64-bit ABI) at each report"
    )
    for output in RENDERERS.file_formats():
        parser.add_argument(f"--{output.name}", metavar="FILE", help=output.option_help)
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


def _add_checks(parser: ArgumentParser) -> None:
    """--unreachable and --leak-check (valgrind's options)."""
    parser.add_argument(
        "--unreachable",
        action="store_true",
        help="at each report while the target lives, freeze it a moment and find the "
        "allocations nothing reachable points to (libmemunreachable's check)",
    )
    parser.add_argument("--contents", action="store_true", help="--unreachable: show the first 32 bytes of each leak")
    parser.add_argument("--limit", type=bounded_int(0), metavar="N", help="--unreachable: leaks shown (default 100)")
    parser.add_valued_flag(
        "--leak-check",
        "full",
        choices=("no", "summary", "yes", "full"),
        help="judge every block still allocated into valgrind's kinds (definitely, indirectly, possibly "
        "lost, still reachable) and list them: -c at the command's exit, -p at the trace's end (default: full). "
        "A CI gate over many small programs: --engine preload (0.3 s a program; a command that ends in _exit "
        "fails unjudged), else the BPF engine (2-5 s, every exit): LOG_COMPILER=leaktrace, "
        "LOG_FLAGS='--engine preload --leak-check=full --error-exitcode=1 --' (docs/ci.md)",
    )
    parser.add_argument(
        "--show-leak-kinds",
        metavar="KINDS",
        help="--leak-check: kinds listed by stack (valgrind's default: definite,possible; or all)",
    )
    parser.add_argument(
        "--errors-for-leak-kinds",
        metavar="KINDS",
        help="--leak-check: kinds that count as errors for --error-exitcode (default: definite,possible)",
    )
    parser.add_argument(
        "--error-exitcode",
        type=bounded_int(1, 255),
        metavar="N",
        help="--leak-check: exit N when a leak of those kinds remains after the suppressions",
    )
    parser.add_argument(
        "--suppressions",
        metavar="FILE",
        action="append",
        help="--leak-check: leaks to leave out, in valgrind's format (Memcheck:Leak) or "
        "LeakSanitizer's (leak:PATTERN); repeatable",
    )
    parser.add_argument(
        "--default-suppressions",
        choices=("yes", "no"),
        default="yes",
        help="--leak-check: apply leaktrace's own (blocks glibc keeps on purpose) (default yes)",
    )
    parser.add_valued_flag(
        "--gen-suppressions",
        "all",
        choices=("no", "yes", "all"),
        help="--leak-check: print a valgrind suppression for each leak listed",
    )
    parser.add_valued_flag(
        "--xml",
        "yes",
        choices=("no", "yes"),
        help="--leak-check: write it in valgrind's XML (protocol 4) to --xml-file, as valgrind --xml=yes does",
    )
    parser.add_argument(
        "--junit",
        metavar="FILE",
        help="--leak-check: write the gate as JUnit XML, a test case a process judged (failed when it leaks)",
    )
    parser.add_argument(
        "--xml-file",
        metavar="FILE",
        help="--xml: the file (%%p: the pid, as valgrind's; needed with -f and --all, one file a process)",
    )


def _add_engine(parser: ArgumentParser) -> None:
    """The engine, children, the command at the end, probes and the kernel maps' capacities."""
    parser.add_argument(
        "--engine",
        choices=("bpf", "preload"),
        default="bpf",
        help="bpf: uprobes (default); preload: run -c's command with leaktrace's LD_PRELOAD "
        "library, which records in the process and dumps on request",
    )
    parser.add_argument(
        "--sample",
        type=_sample_rate,
        default=0,
        metavar="BYTES",
        help="sample by bytes, a block every BYTES on average (512KiB, 2MiB, a number; 0: every call, "
        "the default): estimates cheap enough for a service (cheapest with --engine preload; "
        "the BPF engine decides in the kernel, its traps stay); exact mode is for CI gates, "
        "--leak-check and Android's files",
    )
    parser.add_argument(
        "--sample-seed",
        type=bounded_int(0, (1 << 63) - 1),
        metavar="N",
        help="--sample: the sampler's seed (default: a random one; each report says it)",
    )
    parser.add_argument(
        "-f",
        "--follow-forks",
        action="store_true",
        help="trace child processes too, with the blocks they inherit (their own carry the zygote bit); "
        "the probes then trap in every process that uses the library",
    )
    parser.add_argument(
        "--kill-on-exit",
        action="store_true",
        help="-c: kill the command (SIGKILL) when the trace ends before it (COUNT reports, Ctrl-C); "
        "without it, the command is left running untraced",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="say where each probe went and why (stderr)")
    parser.add_argument(
        "--lib",
        metavar="PATH",
        action="append",
        help="probe this allocator library instead of the target's; with --all, in addition to every libc (repeatable)",
    )
    defaults = EngineSettings()
    for flag, default, what in (
        ("--max-live", defaults.max_live, "live allocations"),
        ("--max-sites", defaults.max_sites, "distinct (pid, stack, size) sites"),
        ("--max-stacks", defaults.max_stacks, "distinct stacks"),
    ):
        parser.add_argument(
            flag,
            type=bounded_int(1, MAP_CAPACITY_LIMIT),
            default=default,
            help=f"map capacity: {what} (default {default})",
        )


def add_trace_arguments(parser: ArgumentParser) -> None:
    """The trace command's target, interval, filters, outputs and engine."""
    _add_target(parser)
    _add_report_view(parser)
    _add_process_selection(parser)
    _add_stack_choices(parser)
    _add_outputs(parser)
    _add_checks(parser)
    _add_engine(parser)


def malloc_debug_config(args: argparse.Namespace) -> MallocDebugConfig:
    try:
        config = parse_malloc_debug_options(args.options)
        check_engine_options(config, args.engine)
    except OptionError as e:
        raise UsageError(str(e).removeprefix("leaktrace: ")) from None
    per_block = [name for name in config.options if name in ALLOCATOR_ONLY]
    if args.sample and per_block:  # a block not kept goes straight to the allocator, unchanged
        raise UsageError(f"option '{per_block[0]}' needs every block: leave out --sample (exact mode)")
    return config


def engine_settings(args: argparse.Namespace, config: MallocDebugConfig) -> EngineSettings:
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
        interpreter_frames=_may_run_interpreter(args),
        sampling=_sampling(args),
    )


def _sampling(args: argparse.Namespace) -> Sampling:
    """--sample and its seed (a random one when not given, then kept in args: one per run)."""
    if not args.sample:
        return EXACT
    if args.sample_seed is None:
        args.sample_seed = random_seed()
    return Sampling(args.sample, args.sample_seed)


def _may_run_interpreter(args: argparse.Namespace) -> bool:
    """Whether the BPF engine walks interpreter frames: the -c program or the -p target is an
    interpreter of the table (by its name), or children are followed (any may be one). Not for
    --all, nor with LEAKTRACE_PYTHON_FRAMES=no (the preload library reads it too)."""
    if os.environ.get("LEAKTRACE_PYTHON_FRAMES") == "no":
        return False
    if args.follow_forks:
        return True
    names: list[str] = []
    if args.command:
        words = shlex.split(args.command)[:1]  # its name, as typed (pyenv's shims are scripts)
        with contextlib.suppress(RuntimeFailure):
            names += [*words, *(program_behind(resolve_executable(word)) for word in words)]
    elif args.pid:
        with contextlib.suppress(OSError):
            names.append(os.readlink(f"/proc/{args.pid}/exe"))
    return any(may_hold_interpreter(name) for name in names)


def _output_paths(args: argparse.Namespace, config: MallocDebugConfig) -> list[tuple[str, str]]:
    """(option, path) of each file the trace will write; for heap dumps, PREFIX.PID.txt's directory."""
    names = ["leak_info"] + [output.name for output in RENDERERS.file_formats()]
    paths = [(f"--{name.replace('_', '-')}", getattr(args, name)) for name in names]
    paths.append(("--junit", args.junit))
    if args.xml_file:  # each pid's file lies where the first would: one check covers them
        paths.append(("--xml-file", args.xml_file.replace("%p", str(os.getpid()))))
    prefix = args.heap_dump or config.values.get("backtrace_dump_prefix")
    dumps = args.heap_dump is not None or args.heap_dump_on_exit or "backtrace_dump_on_exit" in config.options
    if dumps:
        paths.append(("--heap-dump", str(prefix or DEFAULT_DUMP_PREFIX) + ".PID.txt"))
    return [(option, path) for option, path in paths if path]


def check_output_paths(args: argparse.Namespace, config: MallocDebugConfig) -> None:
    """Refuses, before anything starts, an output path the trace could not write or must not
    replace: anything there but a regular file (a device, a FIFO, a symlink, a directory), or
    a directory that is missing or not writable."""
    for option, path in _output_paths(args, config):
        why = not_replaceable(path)
        directory = os.path.dirname(path) or "."
        if why is None and not os.path.isdir(directory):
            why = f"{directory} is not a directory"
        elif why is None and not os.access(directory, os.W_OK):
            why = f"{directory} is not writable"
        if why:
            raise UsageError(f"refusing {option} {path}: {why}")


def _sample_rate(text: str) -> int:
    try:
        rate = parse_size(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a number of bytes (such as 524288, 512KiB or 2MiB)"
        ) from None
    if rate > MAX_SAMPLE_RATE:
        raise argparse.ArgumentTypeError(f"'{text}' is more than 1 GiB between samples")
    return rate


MAX_SAMPLE_RATE = 1 << 30  # a sample every 1 GiB at most: the kernel's draw multiplies it in 64 bits


# What a sampled trace cannot give: every block, or Android's files of every block.
_EXACT_ONLY = (
    ("--leak-check", "leak_check"),
    ("--unreachable", "unreachable"),
    ("--leak-info", "leak_info"),
    ("--heap-dump", "heap_dump"),
    ("--heap-dump-on-exit", "heap_dump_on_exit"),
    ("--leak-track", "leak_track"),
)


def check_sampling(args: argparse.Namespace) -> None:
    """--sample leaves out what needs every block."""
    if args.sample_seed is not None and not args.sample:
        raise UsageError("--sample-seed needs --sample")
    if not args.sample:
        return
    given = [flag for flag, name in _EXACT_ONLY if getattr(args, name) not in (None, False, "no")]
    if given:
        raise UsageError(f"{given[0]} needs every block: leave out --sample (exact mode)")


def check_combinations(args: argparse.Namespace, engine: Engine) -> None:
    """Refuses options that do not go together, before anything starts."""
    if args.kill_on_exit and args.command is None:
        raise UsageError("--kill-on-exit ends a command leaktrace started: use it with -c")
    check_leak_check(args)
    check_sampling(args)
    if args.all:
        if args.unreachable:
            raise UsageError("--unreachable checks one process: use -p or -c, not --all")
        if not engine.traces_every_process:
            raise UsageError(f"--engine {args.engine} traces one process: use -c or -p")
        return
    given = [f"--{name.replace('_', '-')}" for name in _SYSTEMWIDE_ONLY if getattr(args, name) is not None]
    if given:
        raise UsageError(f"{given[0]} needs --all")
    chosen = [f"--{name}" for name in _SELECTION if getattr(args, name) is not None]
    if chosen and not (args.all or args.follow_forks):
        raise UsageError(f"{chosen[0]} needs --all or -f")
    if args.unreachable and args.top_view:
        raise UsageError("--unreachable reports in text or JSON, not in the top view")
    if (args.contents or args.limit is not None) and not args.unreachable:
        raise UsageError(f"{'--contents' if args.contents else '--limit'} needs --unreachable")
    if args.lib and len(args.lib) > 1:
        raise UsageError("--lib is given once, except with --all")
    for flag, name in engine.refuses:
        if getattr(args, name) not in (None, False):
            raise UsageError(f"{flag} works with the BPF engine only")


_LEAK_CHECK_OPTIONS = (
    ("--show-leak-kinds", "show_leak_kinds"),
    ("--errors-for-leak-kinds", "errors_for_leak_kinds"),
    ("--error-exitcode", "error_exitcode"),
    ("--suppressions", "suppressions"),
    ("--gen-suppressions", "gen_suppressions"),
    ("--xml", "xml"),
    ("--xml-file", "xml_file"),
    ("--junit", "junit"),
)


def check_leak_check(args: argparse.Namespace) -> None:
    """--leak-check judges a command leaktrace started at its exit (either engine), or with the
    BPF engine a -p target or every exit of -f and --all; the options that shape it need it."""
    checking = args.leak_check not in (None, "no")
    if not checking:
        given = [flag for flag, name in _LEAK_CHECK_OPTIONS if getattr(args, name) not in (None, "no")]
        if given:
            raise UsageError(f"{given[0]} needs --leak-check")
        return
    if args.engine != "bpf" and args.command is None:
        raise UsageError("--leak-check with --engine preload judges a command it starts (-c or -- PROGRAM)")
    if (args.xml == "yes") != bool(args.xml_file):
        raise UsageError(
            "--xml=yes writes to --xml-file FILE: give both" if args.xml_file is None else "--xml-file needs --xml=yes"
        )
    if args.xml_file and (args.all or args.follow_forks) and "%p" not in args.xml_file:
        raise UsageError("--xml-file needs %p with -f or --all: one file a process, as valgrind writes them")
    from leaktrace.analysis.suppressions import leak_kinds

    for flag, name in (("--show-leak-kinds", "show_leak_kinds"), ("--errors-for-leak-kinds", "errors_for_leak_kinds")):
        if getattr(args, name) is not None:
            leak_kinds(getattr(args, name), flag)


def leak_check_settings(args: argparse.Namespace) -> LeakCheckSettings | None:
    """--leak-check's settings, its suppression files read (UsageError for one that cannot be)."""
    if args.leak_check in (None, "no"):
        return None
    from leaktrace.analysis.suppressions import (
        DEFAULT_SUPPRESSIONS,
        LeakCheckSettings,
        leak_kinds,
        read_suppressions,
    )

    defaults = LeakCheckSettings()
    files = ([DEFAULT_SUPPRESSIONS] if args.default_suppressions == "yes" else []) + (args.suppressions or [])
    return LeakCheckSettings(
        summary_only=args.leak_check == "summary",
        shown=leak_kinds(args.show_leak_kinds, "--show-leak-kinds") if args.show_leak_kinds else defaults.shown,
        errors_for=(
            leak_kinds(args.errors_for_leak_kinds, "--errors-for-leak-kinds")
            if args.errors_for_leak_kinds
            else defaults.errors_for
        ),
        error_exitcode=args.error_exitcode,
        suppressions=tuple(read_suppressions(files)),
        generate=args.gen_suppressions in ("yes", "all"),
    )
