"""The in-process engine: the LD_PRELOAD library (native/*.c) as a source.

A command runs with the library (or a process started with it elsewhere is read).
A snapshot of a launched command stops it for a moment (ptrace, as the reachability
check does) and reads the library's table of live blocks in place, once no thread
holds a lock of one of its shards. A process started elsewhere is asked for a heap dump, as
upstream's users do (SIGRTMAX-17, written at its next allocator call), and read in
place only if none comes. At exit a launched command writes a last dump
(backtrace_dump_on_exit). Dumps are Android's v1.2 text, MAPS included, so a
snapshot from one symbolizes like one from the BPF engine. The reachability check
reads the table from the frozen copy of the process.
"""

from __future__ import annotations

import ctypes
import dataclasses
import fcntl
import os
import shutil
import signal
import stat
import tempfile
import time

from leaktrace.abi.layout import C_COUNTERS
from leaktrace.android.heap_dump import read_heap_dump
from leaktrace.android.leak_info import LeakInfoEntry, decode_leak_info
from leaktrace.android.options import DEFAULT_DUMP_PREFIX, OptionError, parse_malloc_debug_options
from leaktrace.errors import RuntimeFailure
from leaktrace.interpreters.code_capture import CodeCapture
from leaktrace.interpreters.interface import Codes, DamagedCodes, InterpreterProcess
from leaktrace.interpreters.table import INTERPRETERS
from leaktrace.model.snapshot import (
    UNREACHABLE_LIMIT,
    Counters,
    LeakCheck,
    ProcessInfo,
    Snapshot,
    UnreachableReport,
)
from leaktrace.platform.arch import IN_PROCESS_ATTACH, check_machine
from leaktrace.platform.containers import container_of
from leaktrace.platform.elf import ElfError, ElfFile
from leaktrace.platform.module_files import MUSL_NAME, ModuleFiles, allocator_library_of_process, runs_on_musl
from leaktrace.platform.process import (
    alive,
    catches,
    launch,
    parse_maps,
    printable,
    proc_path,
    program_behind,
    read_target,
    resolve_executable,
    waits_in_read,
)
from leaktrace.platform.target_files import (
    RefusedFile,
    credentials_of,
    read_regular,
    read_target_file,
    unlink_target_file,
)
from leaktrace.sources.preload.inject import Injection
from leaktrace.sources.preload.table import (
    DamagedTable,
    SiteRecord,
    copy_with_table,
    counters_from_words,
    counters_in_place,
    library_base,
    parse_sites,
    peak_of,
    preload_library,
    site_totals,
    sites_in_place,
    table_snapshot,
)
from leaktrace.sources.protocol import PollingSource
from leaktrace.sources.sampling import EXACT, Sampling, estimated
from leaktrace.sources.target import TraceTarget
from leaktrace.sources.target_life import TargetLife, TargetState, judged_at_exit

DUMP_SIGNAL = signal.SIGRTMAX - 17
DUMP_WAIT = 1.0  # seconds for a program to make an allocator call and write the dump asked for
DUMP_READ_LIMIT = 512 << 20  # bytes of one heap dump read from a target (about 2.5 million records)
COUNTERS_READ_LIMIT = 4096  # the library's counters file: one line of numbers
ENVIRON_READ_LIMIT = 4 << 20
WORKDIR_PREFIX = "leaktrace-preload-"  # + leaktrace's pid + "-" + random: the dump directory of a launch


def remove_stale_workdirs() -> None:
    """Removes the dump directories that leaktraces which died without cleaning up left behind
    (each is named with its leaktrace's pid): ours only, real directories only."""
    top = tempfile.gettempdir()
    for name in os.listdir(top):
        owner = name.removeprefix(WORKDIR_PREFIX).split("-", 1)[0]
        if not name.startswith(WORKDIR_PREFIX) or not owner.isdigit() or alive(int(owner)):
            continue
        path = os.path.join(top, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            shutil.rmtree(path, ignore_errors=True)


HELD_FDS_FROM = 900  # the command's ends of the exit hold's pipes: above the fds a program counts on


def _exit_hold_pipes() -> tuple[tuple[int, int], tuple[int, int]]:
    """The exit hold's two pipes: leaktrace's ends (notify's read end, not blocking; release's
    write end) and the command's (notify's write end, release's read end), moved to
    HELD_FDS_FROM and up and inherited."""
    notify_read, notify_write = os.pipe()
    release_read, release_write = os.pipe()
    os.set_blocking(notify_read, False)
    theirs = []
    for fd in (notify_write, release_read):
        theirs.append(fcntl.fcntl(fd, fcntl.F_DUPFD, HELD_FDS_FROM))
        os.close(fd)
    return (notify_read, release_write), (theirs[0], theirs[1])


class PreloadTrace(PollingSource):
    """A process running with the library: launched with it (launch) or started with it
    elsewhere (attach); the same snapshots as a BPF trace, from the dumps it writes (or,
    when it makes no allocator call to write one, from its table read in place)."""

    unjudged_why = (
        "its exit was never held: the library holds it in its destructor, which _exit and a fatal signal "
        "skip (the BPF engine judges those)"
    )

    def __init__(
        self,
        identity: ProcessInfo,
        prefix: str,
        backtrace_frames: int,
        workdir: str | None = None,
    ):
        self.pid = pid = identity.pid
        self.identity = identity  # its names, container and the rights its dump files are read and removed with
        self.prefix = prefix  # the library's backtrace_dump_prefix
        self.credentials = identity.credentials
        self.comm = identity.comm
        self.backtrace_frames = backtrace_frames
        self.workdir = workdir  # ours to delete (launch only)
        self.target = TraceTarget.command(pid) if workdir is not None else TraceTarget.process(pid)
        self.life = TargetLife(self.target)  # a launched command reaped, an attached process watched
        self.target_selected = True  # the in-process engine has no choice of processes
        self._gone = False
        self.final_snapshot: Snapshot | None = None
        self._last: Snapshot | None = None
        self.dumps_refused: str | None = None  # why its dump files are not read (its table is, in place)
        self._notices: list[str] = []
        self.leak_check_at_exit = False  # a launch asked for it: the library holds its exit (see launch)
        self._exit_hold: tuple[int, int] | None = None  # (notify's read end, release's write end)
        self._hold_read_fd = -1  # the command's release read end, which its hold waits on
        self._hold_said = False  # a byte came on notify: judged once a thread waits in the hold
        self._exit_checks: tuple[LeakCheck, ...] = ()  # the leak check made while it was held
        self.injection: Injection | None = None  # the library put in by leaktrace: read in place, detached at close
        self.sampling = EXACT  # what the library samples (--sample); its blocks then stand for more
        self.library = preload_library(runs_on_musl(parse_maps(identity.maps)))  # the build for its libc
        self._interpreter: InterpreterProcess | None = None  # the interpreter it runs (interpreters/table.py)
        # What its stacks' interpreter frames name, read while it lives.
        self._interpreted_code = CodeCapture(lambda pid: self._interpreter if pid == self.pid else None)
        self._interpreters_checked = False  # whether its modules were looked at for an interpreter

    @classmethod
    def launch(
        cls, argv: list[str], options: str, sampling: Sampling = EXACT, leak_check: bool = False
    ) -> PreloadTrace:
        """Runs argv with the library, told options (plus a dump at exit into a directory of ours),
        sampling as asked. With leak_check, the library holds the command at its exit (in its
        destructor, after the program's own exit work) on a pipe of ours, for valgrind's kinds."""
        path = resolve_executable(argv[0])
        program = program_behind(path)  # a script: the interpreter its #! names loads the library
        try:
            elf = ElfFile(program)
            loader, own_malloc = elf.interpreter, elf.exports_function("malloc")
        except ElfError:
            loader, own_malloc = "", False
        if loader is None or own_malloc:
            linked = "is statically linked" if loader is None else "defines its own malloc"
            raise RuntimeFailure(
                f"{program} {linked}: the in-process library cannot interpose calls inside an executable; "
                "the BPF engine (leave out --engine preload) probes its allocator by its symbols"
            )
        on_musl = bool(loader and MUSL_NAME.search(loader))  # its loader takes only the build for its libc
        library = preload_library(on_musl)
        remove_stale_workdirs()
        workdir = tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-")
        prefix = os.path.join(workdir, "heap")
        # Once the directory is gone (leaktrace stopped first), the library says and writes nothing at exit.
        env = dict(
            os.environ,
            LD_PRELOAD=library,
            LEAKTRACE_PRELOAD_DIR=workdir,
            LIBC_DEBUG_MALLOC_OPTIONS=f"{options} backtrace_dump_on_exit backtrace_dump_prefix={prefix}",
        )
        if sampling.rate:
            env.update(LEAKTRACE_SAMPLE_BYTES=str(sampling.rate), LEAKTRACE_SAMPLE_SEED=str(sampling.seed))
        frames = parse_malloc_debug_options(options).backtrace_frames
        ours, theirs = _exit_hold_pipes() if leak_check else (None, ())
        if theirs:
            env["LEAKTRACE_EXIT_HOLD"] = f"{theirs[0]},{theirs[1]},{os.getpid()}"
        try:
            pid, errors = launch(path, argv, env)
        finally:
            for fd in theirs:
                os.close(fd)
        failure = os.read(errors, 512).decode()
        os.close(errors)
        if failure:
            os.waitpid(pid, 0)
            shutil.rmtree(workdir, ignore_errors=True)
            for fd in ours or ():
                os.close(fd)
            raise RuntimeFailure(f"cannot run '{argv[0]}': {failure}")
        # The dump directory is ours (mode 0700): its files are read with our own rights.
        name = printable(os.path.basename(argv[0]))
        identity = ProcessInfo(
            pid, name[:15], name, credentials=credentials_of(os.getpid()), container=container_of(pid)
        )
        trace = cls(identity, prefix, frames, workdir)
        trace.sampling, trace.library = sampling, library
        if ours is not None:
            trace.leak_check_at_exit = True
            trace._exit_hold, trace._hold_read_fd = ours, theirs[1]
        return trace

    @classmethod
    def attach(cls, pid: int, options: str, sampling: Sampling = EXACT) -> PreloadTrace:
        """A process already running with the library and its options: its dumps go where those
        say. Any other process has the library put into it, told options, until close()."""
        info = read_target(pid)
        try:
            raw = read_regular(proc_path(pid, "environ"), ENVIRON_READ_LIMIT)
            environ = dict(item.partition(b"=")[::2] for item in raw.split(b"\0") if b"=" in item)
            config = parse_malloc_debug_options(environ.get(b"LIBC_DEBUG_MALLOC_OPTIONS", b"").decode(errors="replace"))
        except (OSError, OptionError, RefusedFile) as e:
            raise RuntimeFailure(f"cannot read pid {pid}'s malloc debug options: {e}") from None
        preloaded = library_base(pid, parse_maps(info.maps)) is not None
        if preloaded and config.options and sampling.rate:
            raise RuntimeFailure(
                f"pid {pid} runs with leaktrace's library and options of its own: --sample needs the "
                "library put in by leaktrace"
            )
        if not preloaded or not config.options:
            check_machine(IN_PROCESS_ATTACH)  # the library put in through ptrace's remote calls
            injection = Injection(pid, options, sampling)
            trace = cls(info, DEFAULT_DUMP_PREFIX, parse_malloc_debug_options(options).backtrace_frames)
            trace.injection = injection
            trace.sampling = sampling
            paths = [mapping.path for mapping in parse_maps(info.maps)]
            said = (interpreter.attach_notice(pid, paths) for interpreter in INTERPRETERS)
            trace._notices += [line for line in said if line]
            return trace
        return cls(info, str(config.values.get("backtrace_dump_prefix", DEFAULT_DUMP_PREFIX)), config.backtrace_frames)

    @property
    def exited(self) -> bool:
        return self._gone

    @property
    def exit_status(self) -> int | None:
        return self.life.exit_status

    def take_notices(self) -> list[str]:
        """What went wrong with the dump files since the last call, a line each (said once)."""
        notices, self._notices = self._notices, []
        return notices

    def _refuse_dumps(self, reason: str) -> None:
        if self.dumps_refused is None:
            self.dumps_refused = reason
            self._notices.append(f"{reason}; reading pid {self.pid}'s table in place instead")

    def _read_dump(self, suffix: str, exited: bool) -> Snapshot | None:
        """The dump the process wrote, None if there is none or it cannot be trusted (said in a notice)."""
        path = f"{self.prefix}.{self.pid}{suffix}"
        try:
            data = read_target_file(self.credentials, path, DUMP_READ_LIMIT)
            if data is None:
                return None
            found = read_heap_dump(
                data.decode(errors="replace"), self.pid, self.comm, time.time(), exited, self.credentials
            )
            codes = self._codes_at_exit() if exited else {}
            sites, peak = self._sites_of_dump(exited)
            dumped = found.processes[self.pid]
            return dataclasses.replace(
                found,
                processes={
                    self.pid: dataclasses.replace(self.identity, maps=dumped.maps, exited=exited, forked=dumped.forked)
                },
                counters=self._counters_of_dump(exited),
                interpreted_code=codes,
                sites=site_totals(self.pid, sites),
                peaks=peak_of(self.pid, sites, peak) if peak else (),
            )
        except RefusedFile as e:
            self._refuse_dumps(str(e))
        except ValueError as e:
            self._refuse_dumps(f"the heap dump {path} is damaged: {e}")
        return None

    def _codes_at_exit(self) -> Codes:
        """The code objects its interpreter frames named, from the file the library writes at
        exit for each interpreter (none for a program that runs none)."""
        codes: Codes = {}
        for interpreter in INTERPRETERS:
            path = f"{self.prefix}.{self.pid}{interpreter.exit_codes_suffix}"
            data = read_target_file(self.credentials, path, interpreter.kept_codes_most)
            try:
                codes.update(interpreter.kept_codes(data, self.pid) if data is not None else {})
            except DamagedCodes as e:
                self._notices.append(f"{e}: its {interpreter.name} frames are not named")
        return codes

    def _sites_of_dump(self, exited: bool) -> tuple[list[SiteRecord], tuple[int, ...] | None]:
        """The sites and peak at a dump: read in place, or at exit from the file the library writes
        before its exit dump (none where there is none, said in a notice when it is damaged)."""
        try:
            if not exited:
                return sites_in_place(self.pid) or ([], None)
            data = read_target_file(self.credentials, f"{self.prefix}.{self.pid}.exit.sites", DUMP_READ_LIMIT)
            return parse_sites(data, self.pid) if data is not None else ([], None)
        except DamagedTable as e:
            self._notices.append(f"{e}: its totals and peak are not shown")
        except (OSError, RuntimeFailure):  # gone since its dump
            pass
        return [], None

    def _counters_of_dump(self, exited: bool) -> Counters:
        """The library's counters at a dump: read in place, or at exit from the file it writes
        before its exit dump (the last ones read where there is none)."""
        last = self._last.counters if self._last else Counters()
        if not exited:
            try:
                return counters_in_place(self.pid)
            except (OSError, RuntimeFailure):  # gone since its dump
                return last
        path = f"{self.prefix}.{self.pid}.exit.counters"
        data = read_target_file(self.credentials, path, COUNTERS_READ_LIMIT)
        if data is None:
            return last
        words = data.split()
        if len(words) != C_COUNTERS or not all(word.isdigit() for word in words):
            raise ValueError(f"its counters file {path} is damaged")
        return counters_from_words([int(word) for word in words], self.pid)

    def snapshot(self, older_than_ms: int | None = None, with_allocations: bool = False) -> Snapshot:
        """The live blocks now, with the code objects their interpreter frames name (_blocks)."""
        found = self._blocks(older_than_ms, with_allocations)
        self._look_at_interpreters(found.processes.get(self.pid))
        return estimated(self._interpreted_code.attach(found), self.sampling)

    def _look_at_interpreters(self, process: ProcessInfo | None) -> None:
        """Once: the interpreter a module named for one holds (the library judges by the same
        tables), or a notice that it is one the library does not walk."""
        if self._interpreters_checked or process is None:
            return
        self._interpreters_checked = True
        maps = parse_maps(process.maps)
        for interpreter in INTERPRETERS:
            named = [m for m in maps if m.offset == 0 and interpreter.may_hold(m.path)]
            for elf in ModuleFiles().open(process, named).values():
                found = interpreter.load(elf) if elf is not None else None
                if found is None:
                    continue
                self._interpreter = found.attach(self.pid) or self._interpreter
                unwalked = found.unwalked(in_kernel=False, on_musl=False)
                if unwalked:
                    self._notices.append(unwalked)

    def _blocks(self, older_than_ms: int | None = None, with_allocations: bool = False) -> Snapshot:
        """The live blocks now (the final dump once the process has exited).

        A launched command is stopped for a moment and its table read in place: no signal
        reaches it, so none of its system calls is cut short. A process started elsewhere
        is asked for a dump, as malloc_debug's users do (SIGRTMAX-17; it writes one at its
        next allocator call); if none comes within DUMP_WAIT, its table is read in place.
        The library keeps no ages: older_than_ms is refused."""
        if older_than_ms is not None:
            raise RuntimeFailure("the preload engine keeps no allocation ages")
        if self.exited:
            if self.final_snapshot is None:
                raise RuntimeFailure(f"pid {self.pid} exited and left no table or dump that could be read")
            return self.final_snapshot
        if (
            not self.target.is_command
            and not self.injection
            and not with_allocations
            and self.dumps_refused is None
            and catches(self.pid, DUMP_SIGNAL)
        ):
            found = self._requested_dump(DUMP_WAIT)
            if found:
                self._last = found
                return found
        try:
            self._last = table_snapshot(self.identity, self.backtrace_frames)
        except RuntimeFailure:
            if not self.poll():
                return self._blocks()
            raise
        return self._last

    def _requested_dump(self, wait: float) -> Snapshot | None:
        # Sent only to a process the kernel says catches it (the library installs its handler
        # only when it has options): elsewhere the signal's default action would kill it.
        """Asks for a dump and reads it; None if none comes within wait seconds, or its file cannot be trusted."""
        try:  # so that the next one is known to be new
            unlink_target_file(self.credentials, f"{self.prefix}.{self.pid}.txt")
        except RefusedFile as e:
            self._refuse_dumps(str(e))
            return None
        try:
            os.kill(self.pid, DUMP_SIGNAL)
        except PermissionError:
            self._refuse_dumps(f"cannot signal pid {self.pid} for a dump (another user's process needs CAP_KILL)")
            return None
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and self.dumps_refused is None:
            found = self._read_dump(".txt", False)
            if found or not self.poll():
                return found or self._blocks()
            time.sleep(0.01)
        return None

    def poll(self) -> bool:
        """False once the process has exited; its exit dump (or else its last snapshot) is then final."""
        if self._gone:
            return False
        self._judge_if_held()
        if self.life.look() is not TargetState.ENDED:
            return True
        self._gone = True
        last = self._last and dataclasses.replace(
            self._last,
            processes={pid: dataclasses.replace(info, exited=True) for pid, info in self._last.processes.items()},
        )
        self.final_snapshot = self._read_dump(".exit.txt", True) or last
        if self.final_snapshot is not None and self._exit_checks:
            self.final_snapshot = dataclasses.replace(self.final_snapshot, leak_checks=self._exit_checks)
        self._release_exit_hold()
        return False

    def _judge_if_held(self) -> None:
        """The command held at its exit (it said so on the notify pipe, and a thread of it waits
        in the hold's read: a byte alone may be the program's own, or a child's): valgrind's
        kinds of its blocks, all in the library's table since its start, then it is let go."""
        if self._exit_hold is None:
            return
        try:
            said = os.read(self._exit_hold[0], 64)
        except BlockingIOError:
            said = None
        if said == b"":  # every write end closed: the command exited without a hold
            self._release_exit_hold()
            return
        self._hold_said = self._hold_said or bool(said)
        if not self._hold_said or not waits_in_read(self.pid, self._hold_read_fd):
            return
        from leaktrace.reachability.unreachable import judge_leak_kinds_copied, scanned_mapping  # numpy

        def judge() -> LeakCheck:
            process = read_target(self.pid)
            image, allocations, table = copy_with_table(self.pid, scanned_mapping)
            check = judge_leak_kinds_copied(process, image, allocations, table.library_memory)
            if table.own_maps_unlisted:
                self._notices.append(
                    f"leak check: {table.own_maps_unlisted} of the library's own mappings were not listed "
                    "and were scanned as the program's memory: a leak they point to may be called reachable"
                )
            return check

        self._exit_checks = judged_at_exit(self.pid, judge, self._notices)
        self._release_exit_hold()

    def _release_exit_hold(self) -> None:
        """The command goes on to its exit (the release pipe's end closed); nothing more is judged."""
        if self._exit_hold is not None:
            for fd in self._exit_hold:
                os.close(fd)
            self._exit_hold = None

    def startup_lines(self, what: str, verbose: bool) -> list[str]:
        how = "attached in-process: its hooks come out when leaktrace ends" if self.injection else "LD_PRELOAD"
        return [f"reading {what} through {self.library} ({how})"]

    def check_unreachable(self, limit: int = UNREACHABLE_LIMIT) -> UnreachableReport:
        """The reachability check, with the allocations read from the library's own table
        in the frozen copy: exactly the blocks live at the freeze."""
        if self.exited:
            raise RuntimeFailure(f"pid {self.pid} has exited: nothing to check")
        from leaktrace.reachability.unreachable import (  # numpy: 50 ms of start-up, only for this
            scanned_mapping,
            sweep_image,
            sweep_with_heap_walk,
        )

        image, allocations, table = copy_with_table(self.pid, scanned_mapping)
        if not self.injection:
            return sweep_image(image, allocations, complete=True, limit=limit, excluded=table.library_memory)
        # Put in while it ran: the blocks from before the attach are the heap walk's.
        process = read_target(self.pid)
        allocator = allocator_library_of_process(process, ModuleFiles()).path
        return sweep_with_heap_walk(
            process, image, allocations, limit, allocator, table.own_blocks(), table.library_memory
        )

    def check_leak_kinds(self) -> LeakCheck:
        raise RuntimeFailure("the in-process engine judges a launched command at its exit only (-c --leak-check)")

    def close(self) -> None:
        self._release_exit_hold()
        if self.injection and not self._gone:
            self.injection.detach()
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def leak_info_in_process() -> list[LeakInfoEntry]:
    """get_malloc_leak_info() of this very process, which must run with the library
    preloaded (LD_PRELOAD=$(leaktrace --preload-lib) python ...)."""
    try:
        function = ctypes.CDLL(None).get_malloc_leak_info
    except AttributeError:
        raise RuntimeFailure("this process was not started with leaktrace's preload library") from None
    info, sizes = ctypes.POINTER(ctypes.c_uint8)(), [ctypes.c_size_t() for _ in range(4)]
    function(ctypes.byref(info), *(ctypes.byref(s) for s in sizes))
    overall, _, _, backtrace_size = (s.value for s in sizes)
    try:
        return decode_leak_info(ctypes.string_at(info, overall), backtrace_size) if overall else []
    finally:
        ctypes.CDLL(None).free_malloc_leak_info(info)
