"""bcc's compile of leaktrace.bpf.c for an engine's settings, run in a thread.

clang holds no GIL, so whatever the caller does meanwhile (importing the rest of
leaktrace, reading and disassembling libraries) costs no start-up time. The CLI starts
the compile as soon as its arguments are known (`compile_ahead`); the engine then
takes that compile if it was made for its flags, or starts its own (`claim_or_start_compile`).
Until a compile ends, fds 1 and 2 are its log: nothing may print meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading

from bcc import BPF

from leaktrace.errors import RuntimeFailure
from leaktrace.interpreters.table import INTERPRETERS
from leaktrace.platform.arch import HOST
from leaktrace.platform.kernel_types import member_offsets
from leaktrace.platform.system import tracepoint_fields
from leaktrace.sources.bpf.cookie_stubs import COOKIE_TARGETS
from leaktrace.sources.bpf.kernel_features import PERF_LINK_COOKIE, TASK_STORAGE, UPROBE_MULTI, UPROBE_SESSION, offers
from leaktrace.sources.bpf.links import BPF_TRACE_UPROBE_MULTI, BPF_TRACE_UPROBE_SESSION
from leaktrace.sources.bpf.stop_owners import stop_owners_cflags
from leaktrace.sources.settings import EngineSettings
from leaktrace.sources.target import TraceTarget

# Programs attached through uprobe_multi links, so loaded for them; and the stack walk
# the allocating calls' return tail-calls, which must be loaded as its caller is.
LINKED_PROGRAMS = (b"free_enter", b"exit_stop", b"interpreter_stop", b"modules_changed")


def returns_by_session(settings: EngineSettings) -> bool:
    """Whether the allocating calls are probed by one uprobe session program, whose entry run
    skips the return of a call not sampled (a trap saved), rather than an entry and a return
    program: when sampling, on a kernel that has sessions."""
    return bool(settings.sampling.rate) and offers(UPROBE_SESSION)


def linked_programs(settings: EngineSettings) -> dict[bytes, int]:
    """Each program loaded for a link, with the attach type it is loaded for (a plain kprobe
    program, -1 to bcc, where the kernel has no uprobe_multi and perf events carry them)."""
    multi = BPF_TRACE_UPROBE_MULTI if offers(UPROBE_MULTI) else -1
    if returns_by_session(settings):
        calls = {b"alloc_session": BPF_TRACE_UPROBE_SESSION, b"unwind_frames": BPF_TRACE_UPROBE_SESSION}
    else:
        calls = {p: multi for p in (b"alloc_enter", b"alloc_return", b"unwind_frames")}
    return calls | {program: multi for program in LINKED_PROGRAMS}


TERMINAL_MEMBERS = {("task_struct", "signal"): "TASK_SIGNAL", ("signal_struct", "tty"): "SIGNAL_TTY"}
VERIFIER_STATISTICS = re.compile(r"processed \d+ insns|verification time|stack depth")


# The headers the program includes, put in place of their #include (bcc compiles one text).
# Paths beside the package, not importlib.resources: that import costs 12 ms of start-up.
_HERE = os.path.dirname(__file__)
_UNWIND = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "unwind")
_PLATFORM = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "platform")
_ABI = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "abi")
_INTERPRETERS = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "interpreters")
BPF_HEADERS = {
    "arch.h": os.path.join(_PLATFORM, "arch.h"),
    "layout.h": os.path.join(_ABI, "layout.h"),
    "rows.h": os.path.join(_UNWIND, "rows.h"),
    "walk_state.h": os.path.join(_UNWIND, "walk_state.h"),
    "walk.bpf.h": os.path.join(_UNWIND, "walk.bpf.h"),
    "interpreter_words.h": os.path.join(_INTERPRETERS, "interpreter_words.h"),
    "interpreter_walks.bpf.h": os.path.join(_INTERPRETERS, "interpreter_walks.bpf.h"),
    **{name: path for interpreter in INTERPRETERS for name, path in interpreter.kernel_headers().items()},
}


def bpf_source() -> str:
    """The program's text with its own headers in place."""
    with open(os.path.join(_HERE, "leaktrace.bpf.c")) as source:
        text = source.read()
    for name, path in BPF_HEADERS.items():
        with open(path) as header:
            content = header.read()
        text = re.sub(rf'^#include "{re.escape(name)}".*$', lambda _: content, text, count=1, flags=re.M)  # noqa: B023
    return text


# Where a task's thread group keeps its count of live threads (signal_struct.live): the test of
# a group's death on kernels whose sched_process_exit has no group_dead field (Debian's 5.10 to 6.12).
LIVE_MEMBERS = (("task_struct", "signal"), ("signal_struct", "live"))


def _tracepoint_cflags(follow_forks: bool) -> list[str]:
    """Where the fork and exit tracepoints keep the fields the BPF program reads (-f only)."""
    if not follow_forks:
        return ["-DNEWTASK_PID=0", "-DNEWTASK_CLONE_FLAGS=0", "-DEXIT_GROUP_DEAD=0"]
    newtask = tracepoint_fields("task", "task_newtask")
    exits = tracepoint_fields("sched", "sched_process_exit")
    live = member_offsets(LIVE_MEMBERS) if "group_dead" not in exits else {}
    if "pid" not in newtask or "clone_flags" not in newtask or ("group_dead" not in exits and len(live) != 2):
        raise RuntimeFailure(
            "this kernel's task_newtask and sched_process_exit tracepoints lack the "
            "fields -f needs (pid, clone_flags, and group_dead or its BTF's signal_struct.live)"
        )
    group_dead = (
        [f"-DEXIT_GROUP_DEAD={exits['group_dead']}"]
        if "group_dead" in exits
        else [
            "-DEXIT_GROUP_DEAD=0",
            *(f"-D{macro}={live[member]}" for member, macro in zip(LIVE_MEMBERS, ("EXIT_TASK_SIGNAL", "SIGNAL_LIVE"))),
        ]
    )
    return [f"-DNEWTASK_PID={newtask['pid']}", f"-DNEWTASK_CLONE_FLAGS={newtask['clone_flags']}", *group_dead]


def program_cflags(settings: EngineSettings, target: TraceTarget) -> list[str]:
    """The program's -D flags for an engine tracing target (every process: with children)."""
    s = settings
    follow_forks = s.follow_forks or target.is_every_process
    attached = not target.is_command and not target.is_every_process
    return (
        [
            f"-DTARGET_TGID={target.pid or 0}",  # the program's word for no one process: 0, never a pid
            f"-DFOLLOW_FORKS={int(follow_forks)}",
            f"-DTRACE_ALL={int(target.is_every_process)}",
            f"-DTARGET_ATTACHED={int(attached)}",
            # Its pid namespace's nsfs device and inode (0 0: every process on the machine).
            *(
                f"-D{name}={value}ULL"
                for name, value in zip(("PIDNS_DEV", "PIDNS_INO"), target.pid_namespace or (0, 0))
            ),
            f"-DSELF_TGID={os.getpid()}",
            f"-DLEAKTRACE_ARCH_{HOST.machine}",  # arch.h's table: a BPF program is built for no machine
            f"-DMAX_PROCS={s.max_procs}",
            f"-DSTACK_DEPTH={s.stack_depth}",
            f"-DLT_SIZE_MIN={s.size_min}ULL",
            f"-DLT_SIZE_MAX={s.size_max}ULL",
            f"-DPAGE_BYTES={os.sysconf('SC_PAGE_SIZE')}",
            f"-DMAX_LIVE={s.max_live}",
            f"-DMAX_SITES={s.max_sites}",
            f"-DMAX_STACKS={s.max_stacks}",
            f"-DUNWIND_DWARF={int(s.unwind == 'dwarf')}",
            f"-DMAX_ROWS={s.max_unwind_rows}",
            f"-DMAX_PAGES={s.max_unwind_pages}",
            f"-DSAMPLE_BYTES={s.sampling.rate}ULL",
            f"-DSAMPLE_SEED={s.sampling.seed}ULL",
            f"-DRETURN_SESSION={int(returns_by_session(s))}",
            f"-DTASK_STORAGE={int(offers(TASK_STORAGE))}",
            f"-DMAX_THREADS={s.max_threads}",
            f"-DATTACH_COOKIES={int(offers(PERF_LINK_COOKIE))}",
            f"-DCOOKIE_TARGETS={len(COOKIE_TARGETS)}",
        ]
        + _tracepoint_cflags(follow_forks)
        + _terminal_cflags(follow_forks, attached and s.interpreter_frames)
        + list(stop_owners_cflags())
        + [flag for interpreter in INTERPRETERS for flag in interpreter.kernel_cflags(s.interpreter_frames)]
    )


def _terminal_cflags(follow_forks: bool, attached_interpreter: bool) -> list[str]:
    """Where the kernel's BTF says a task's controlling terminal is, for the stops that spare a
    process on one: holds of programs exec'd with children traced (hold_for_tables) and -p's
    interpreter stop (interpreter_stop, at its code_freed_by). Without it, neither stops anything."""
    offsets = member_offsets(TERMINAL_MEMBERS) if follow_forks or attached_interpreter else {}
    known = len(offsets) == len(TERMINAL_MEMBERS)
    places = [f"-D{macro}={offsets[member]}" for member, macro in TERMINAL_MEMBERS.items()] if known else []
    return [f"-DHOLD_IMAGES={int(follow_forks and known)}", f"-DTERMINAL_KNOWN={int(known)}", *places]


@contextlib.contextmanager
def bcc_output():
    """Catches what bcc and clang print (on fds 1 and 2) in a memory file, yielded for reading."""
    with open(os.memfd_create("leaktrace-bcc-log"), "w+") as log:
        saved = [os.dup(fd) for fd in (1, 2)]
        for fd in (1, 2):
            os.dup2(log.fileno(), fd)
        try:
            yield log
        finally:
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)


def first_error_line(text: str) -> str:
    # The verifier ends its log with statistics; its verdict is the line before them.
    lines = [line.strip() for line in text.splitlines() if line.strip() and not VERIFIER_STATISTICS.match(line.strip())]
    # bcc's own word on missing kernel headers says more than the clang error that follows it.
    for wanted in ("kernel headers", "error"):
        for line in lines:
            if wanted in line.lower():
                return line
    return lines[-1] if lines else "unknown error"


class Compiling(threading.Thread):
    """The compile for cflags and the load of the linked programs, under way in a thread."""

    def __init__(self, cflags: list[str], programs: dict[bytes, int]):
        super().__init__(name="bcc compile", daemon=True)
        self.cflags, self.programs, self._source = cflags, programs, bpf_source().encode()
        self._value: tuple[BPF, dict[bytes, int]] | None = None
        self._error: RuntimeFailure | None = None
        self.start()

    def run(self) -> None:
        with bcc_output() as log:
            try:
                bpf = BPF(text=self._source, cflags=self.cflags)
                programs = {
                    program: bpf.load_func(program, BPF.KPROBE, attach_type=attach_type).fd
                    for program, attach_type in self.programs.items()
                }
                self._value = bpf, programs
                return
            except Exception as e:  # bcc raises bare Exception
                log.seek(0)
                error = first_error_line(log.read() or str(e))
        self._error = RuntimeFailure(f"cannot load the BPF program: {error}")

    def result(self):
        """(the bcc.BPF, fd of each linked program) once the compile is done; raises its failure."""
        self.join()
        if self._error is not None:
            raise self._error
        return self._value

    def discard(self) -> None:
        """Waits for the compile (its log holds fds 1 and 2 until then) and frees what it made."""
        self.join()
        if self._value is not None:
            with bcc_output():
                self._value[0].cleanup()
            self._value = None


_ahead: Compiling | None = None  # started by compile_ahead, not yet taken by an engine


def compile_ahead(settings: EngineSettings, target: TraceTarget) -> Compiling:
    """Starts the compile an engine for (settings, target) will ask for."""
    global _ahead
    discard_compile_ahead()
    _ahead = Compiling(program_cflags(settings, target), linked_programs(settings))
    return _ahead


def discard_compile_ahead() -> None:
    """Discards a compile started ahead that no engine took: until it ends, output is lost."""
    global _ahead
    ahead, _ahead = _ahead, None
    if ahead is not None:
        ahead.discard()


def claim_or_start_compile(settings: EngineSettings, target: TraceTarget) -> Compiling:
    """The compile started ahead for these flags, or a new one."""
    global _ahead
    cflags = program_cflags(settings, target)
    programs = linked_programs(settings)
    if _ahead is not None and (_ahead.cflags, _ahead.programs) == (cflags, programs):
        ahead, _ahead = _ahead, None
        return ahead
    discard_compile_ahead()  # two compiles would both redirect fds 1 and 2
    return Compiling(cflags, programs)
