"""How the trace command starts each engine: one factory per engine, and what each cannot do."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from leaktrace.android.options import MallocDebugConfig
from leaktrace.commands import say
from leaktrace.errors import UsageError
from leaktrace.platform.arch import HOST, IN_PROCESS, check_machine
from leaktrace.platform.containers import container_pid_namespace
from leaktrace.platform.system import check_system
from leaktrace.sources.settings import EngineSettings
from leaktrace.sources.target import TraceTarget

if TYPE_CHECKING:
    from leaktrace.sources.protocol import TraceSource


def command_argv(args: argparse.Namespace) -> list[str]:
    argv = shlex.split(args.command)
    if not argv:
        raise UsageError("-c needs a command")
    return argv


def start_preload(
    args: argparse.Namespace, settings: EngineSettings, config: MallocDebugConfig
) -> tuple[TraceSource, str]:
    """--engine preload: -c's command run with the library, told the same options; or -p's
    process: one started with the library elsewhere is asked for dumps, any other has the
    library put into it (and taken out at the end)."""
    from leaktrace.sources.preload.trace import PreloadTrace

    check_machine(IN_PROCESS)
    # The user's string (allocator-side options included), then what the flags decided: last wins.
    stacks = (
        "backtrace_enable_on_signal"
        if "backtrace_enable_on_signal" in config.options and "backtrace" not in config.options
        else "backtrace"
    )
    options = [args.options, f"{stacks}={settings.stack_depth}"]
    options += [f"backtrace_min_size={settings.size_min}"] if settings.size_min else []
    options += [f"backtrace_max_size={settings.size_max}"] if settings.size_max != HOST.size_max else []
    options += ["leak_track"] if args.leak_track else []
    told = " ".join(option for option in options if option)
    if args.pid is not None:
        return PreloadTrace.attach(args.pid, told, settings.sampling), f"pid {args.pid}"
    trace = PreloadTrace.launch(command_argv(args), told, settings.sampling, settings.leak_check_at_exit)
    return trace, f"command '{args.command}' {trace.pid}"


def start_bpf(args: argparse.Namespace, settings: EngineSettings, config: MallocDebugConfig) -> tuple[TraceSource, str]:
    """The trace the arguments ask for, and how to name its target."""
    from leaktrace.sources.bpf.compile import compile_ahead, discard_compile_ahead  # bcc: the BPF engine's alone
    from leaktrace.sources.bpf.kernel_features import check_kernel

    check_system()
    check_kernel()
    namespace = None
    if args.container is not None:
        container, namespace = container_pid_namespace(args.container)
        say(f"tracing the processes of {container.runtime} container {container.short_id} (its pid namespace)")
    if args.command is None:
        # The target is known: clang starts before the rest of leaktrace loads and the
        # target is looked at. (-c's pid exists only once its command is spawned.)
        compile_ahead(settings, TraceTarget.every_process(namespace) if args.all else TraceTarget.process(args.pid))
    try:
        from leaktrace.sources.bpf.process_tracking import Selection
        from leaktrace.sources.bpf.trace import BpfTrace

        selection = Selection(args.pid_filter or frozenset(), args.comm, args.uid, args.exe)
        if args.all:
            trace = BpfTrace.everything(settings, tuple(args.lib or ()), selection, namespace)
            return trace, "every process" if namespace is None else f"container {args.container}"
        library = args.lib[0] if args.lib else None
        if args.command is None:
            return BpfTrace.attach(args.pid, settings, library, selection), f"pid {args.pid}"
        trace = BpfTrace.launch(command_argv(args), settings, library, selection)
        return trace, f"command '{args.command}' {trace.pid}"
    except BaseException:
        discard_compile_ahead()  # fds 1 and 2 are the compile's log until it ends: the error waits for it
        raise


@dataclass(frozen=True)
class Engine:
    """How the trace command starts one engine, and what it cannot do."""

    start: Callable[[argparse.Namespace, EngineSettings, MallocDebugConfig], tuple[TraceSource, str]]
    traces_every_process: bool
    logs_own_leaks: bool = False  # the target writes its own leak_track log at exit (the library does)
    refuses: tuple[tuple[str, str], ...] = ()  # (flag, argparse name) the engine has no use for


ENGINES = {
    "bpf": Engine(start_bpf, traces_every_process=True),
    "preload": Engine(
        start_preload,
        traces_every_process=False,
        logs_own_leaks=True,
        refuses=(("--older-than", "older_than"), ("-f", "follow_forks"), ("--lib", "lib")),
    ),
}
