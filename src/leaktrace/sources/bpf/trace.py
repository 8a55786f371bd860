"""The Python API under the CLI: trace a process, take snapshots, end cleanly.

with BpfTrace.launch(["./prog"]) as trace:
    trace.wait()
report = render_text(Symbolizer().symbolize(trace.final_snapshot))
"""

from __future__ import annotations

import dataclasses
import os
import time

from leaktrace.errors import RuntimeFailure
from leaktrace.interpreters.code_capture import CodeCapture
from leaktrace.interpreters.table import INTERPRETERS
from leaktrace.model.snapshot import UNREACHABLE_LIMIT, Counters, LeakCheck, ProcessInfo, Snapshot, UnreachableReport
from leaktrace.platform.arch import HOST
from leaktrace.platform.elf import ElfError, ElfFile
from leaktrace.platform.module_files import (
    ModuleFiles,
    allocator_library_of_process,
    libc_libraries,
    linked_allocator,
    module_exporting,
)
from leaktrace.platform.process import (
    MapsFollower,
    library_of_executable,
    on_terminal,
    process_state,
    program_behind,
    program_loader,
    read_process,
    read_target,
    resolve_executable,
    valgrind_guests,
)
from leaktrace.platform.system import check_system
from leaktrace.sources.bpf.engine import BpfEngine, EngineSettings
from leaktrace.sources.bpf.image_holds import ImageHolds
from leaktrace.sources.bpf.kernel_features import features_off
from leaktrace.sources.bpf.launch import StopRelease, reap, spawn_gated
from leaktrace.sources.bpf.map_reading import TracedProcess
from leaktrace.sources.bpf.process_tracking import ProcessTracker, Selection
from leaktrace.sources.bpf.stop_owners import UNSHARED_NOTICE, StopOwners, stop_owners_cflags
from leaktrace.sources.protocol import PollingSource
from leaktrace.sources.sampling import estimated
from leaktrace.sources.target import TraceTarget
from leaktrace.sources.target_life import TargetLife, TargetState, judged_at_exit, named_by_command_line

MAPS_REFRESH = 0.2  # seconds between reads of traced processes' maps (dlopen'ed modules get tables)
UNJUDGED_SHOWN = 5  # pids a notice names of the processes that exited without their leak check


def _library(path: str) -> ElfFile:
    """An allocator library the user named (or the program's loader found)."""
    try:
        return ElfFile(path)
    except ElfError as e:
        raise RuntimeFailure(f"cannot read allocator library: {e}") from None


def _code_freed_in_program(program: str) -> tuple[ElfFile, str] | None:
    """The module of a program that holds an interpreter of the table (the program, or a library
    it loads), and the interpreter's function that frees its code; None where it holds none."""
    for interpreter in INTERPRETERS:
        frees = interpreter.code_freed_by
        try:
            elf = ElfFile(program)
            return (elf if elf.exports_function(frees) else ElfFile(library_of_executable(program, frees)), frees)
        except (ElfError, RuntimeFailure):
            continue
    return None


def _code_freed_in_process(process: ProcessInfo, modules: ModuleFiles) -> tuple[ElfFile, str] | None:
    """The module of a running process that holds an interpreter of the table, and the
    interpreter's function that frees its code; None where it maps none."""
    for interpreter in INTERPRETERS:
        elf = module_exporting(process, modules, interpreter.may_hold, interpreter.code_freed_by)
        if elf is not None:
            return elf, interpreter.code_freed_by
    return None


def _started_or_closed(engine: BpfEngine) -> BpfEngine:
    """The engine, started; closed again (nothing left attached) if starting fails."""
    try:
        engine.start()
    except BaseException:
        engine.close()
        raise
    return engine


class BpfTrace(PollingSource):
    """A BPF trace of one process (target.pid) or of every process; a context manager that
    always detaches."""

    unjudged_why = (
        "leaktrace did not see it stop in _exit; another tracer's probes or holds on the machine can cause this"
    )

    def __init__(self, engine: BpfEngine, info: ProcessInfo | None, selection: Selection = Selection()):
        self.engine = engine
        self.target = engine.target
        self._exit_checks: list[LeakCheck] = []  # --all: processes judged at their exit, not reported yet
        self.final_snapshot: Snapshot | None = None
        self.life = TargetLife(self.target)  # a launched command reaped, an attached process watched
        self._exited = False  # its end taken: the final snapshot is read, or being read
        self._interpreted_code = CodeCapture(engine.upload.interpreters.get)
        self.processes = ProcessTracker(engine, selection, info, lambda: self._exited)
        self._stop_release: StopRelease | None = None  # a launched command, continued if leaktrace dies
        self._unprobed_at_exit: str | None = None  # the allocator -c's last image used unprobed, seen at its exit stop
        # Continues what this trace stopped, once no other leaktrace holds it.
        self._stop_owners = StopOwners(engine.kernel.bpf[b"stop_owners"])
        self._stop_owners.sweep()
        self._holds = (
            ImageHolds(engine.kernel.bpf, self._serve_hold, self._judge_exit, self._stop_owners.let_go)
            if engine.kernel.holds_images
            else None
        )

    # -- starting -----------------------------------------------------------

    @classmethod
    def attach(
        cls,
        pid: int,
        settings: EngineSettings = EngineSettings(),
        library: str | None = None,
        selection: Selection = Selection(),
    ) -> BpfTrace:
        """Traces a running process from now on (with follow_forks, the children selection keeps)."""
        check_system()
        if pid == os.getpid():
            raise RuntimeFailure("leaktrace cannot trace itself")
        info = read_target(pid)
        modules = ModuleFiles()
        elf = _library(library) if library else allocator_library_of_process(info, modules, "; use --lib PATH")
        # Its interpreter is stopped once where it frees its code, as -c's is, for the code its
        # frames name; a continuer lets it go if leaktrace dies meanwhile.
        frees = _code_freed_in_process(info, modules) if settings.interpreter_frames else None
        engine = BpfEngine(settings, TraceTarget.process(pid), (elf,), code_freed_at=frees)
        if frees and on_terminal(pid):
            engine.notices.append(
                f"pid {pid} is on a terminal, and is not stopped before its interpreter frees its code: "
                "an interpreter frame that no report saw while it ran is not named"
            )
        release = StopRelease(pid) if frees else None
        try:
            trace = cls(_started_or_closed(engine), info, selection=selection)
        except BaseException:
            if release is not None:
                release.release()
            raise
        trace._stop_release = release
        return trace

    @classmethod
    def launch(
        cls,
        argv: list[str],
        settings: EngineSettings = EngineSettings(),
        library: str | None = None,
        selection: Selection = Selection(),
    ) -> BpfTrace:
        """Starts argv with the probes already live: none of its allocations is missed (with
        follow_forks, of the processes selection keeps, the command too)."""
        check_system()
        path = resolve_executable(argv[0])
        program = program_behind(path)  # a script: the program it runs is traced through its exec
        library = library or library_of_executable(program)
        libc = library_of_executable(program, "_Exit")
        elf = _library(library)
        if library == program and elf.interpreter is None:  # its allocator linked in: found by its symbols
            elf = linked_allocator(read_target(os.getpid()), ModuleFiles(), elf)
        frees = _code_freed_in_program(program) if settings.interpreter_frames else None
        pid, gate, errors = spawn_gated(path, argv)
        engine = BpfEngine(
            settings,
            TraceTarget.command(pid),
            (elf,),
            stop_library=libc or library,
            loader=program_loader(program),
            code_freed_at=frees,
        )
        release = StopRelease(pid)
        try:
            engine.start()
            os.write(gate, b"x")
            os.close(gate)
            failure = os.read(errors, 512).decode()
            os.close(errors)
            if failure:
                raise RuntimeFailure(f"cannot run '{argv[0]}': {failure}")
        except BaseException:
            engine.close()
            reap(pid, kill=True)
            release.release()
            raise
        trace = cls(engine, read_process(pid), selection=selection)
        trace._stop_release = release
        trace._await_first_tables()
        return trace

    def _await_first_tables(self, timeout: float = 2.0) -> None:
        """Polls until the launched command's first image has its unwind tables (its first
        allocator call waits for them), it exits, or timeout: a caller that polls rarely
        does not leave it stopped at its start."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.poll() and not self.engine.kernel.tables_loaded():
            time.sleep(0.002)

    @classmethod
    def everything(
        cls,
        settings: EngineSettings = EngineSettings(),
        libraries: tuple[str, ...] = (),
        selection: Selection = Selection(),
        pid_namespace: tuple[int, int] | None = None,
    ) -> BpfTrace:
        """Traces every process that calls into a libc on this system (and into libraries),
        each from its first allocator call; children inherit as with follow_forks. With
        pid_namespace (its nsfs device and inode), only the processes of that namespace."""
        check_system()
        found = libc_libraries(ModuleFiles())
        named = [_library(path) for path in libraries]
        known = {elf.identity for elf in found}
        engine = BpfEngine(
            settings,
            TraceTarget.every_process(pid_namespace),
            found + tuple(elf for elf in named if elf.identity not in known),
        )
        return cls(_started_or_closed(engine), None, selection=selection)

    # -- running ------------------------------------------------------------

    def snapshot(self, older_than_ms: int | None = None, with_allocations: bool = False) -> Snapshot:
        """The live allocations now (or the final ones, once the target has exited).

        Children that exited since the previous snapshot appear in this one, once.
        """
        if self._exited and self.final_snapshot is not None and older_than_ms is None:
            return self.final_snapshot
        taken = time.time()  # before anything is read: what the snapshot shows is at least this recent
        older_than_ns = None if older_than_ms is None else older_than_ms * 1_000_000
        departures = self.processes.take_departed()
        pids = self.processes.traced_pids()
        processes = {pid: self.processes.process_info(pid) for pid in pids}
        groups = self.engine.reader.groups(older_than_ns, set(pids))
        allocations = self.engine.reader.allocations(set(pids)) if with_allocations else None
        sites, peaks = self.engine.reader.sites_and_peaks(set(pids))
        for departed in departures:
            processes[departed.info.pid] = departed.info
            groups += departed.groups
            sites += departed.sites
            peaks += departed.peaks
            if self.engine.settings.exit_allocations:  # for their exit leak log, even when not asked for the rest
                allocations = (allocations or []) + departed.allocations
        judged, self._exit_checks = self._exit_checks, []
        snapshot = Snapshot(
            taken,
            tuple(groups),
            self.engine.reader.counters(),
            processes,
            self.engine.settings.stack_depth,
            None if allocations is None else tuple(allocations),
            leak_checks=tuple(judged),
            sites=tuple(sites),
            peaks=tuple(peaks),
        )
        snapshot = estimated(snapshot, self.engine.settings.sampling)
        return self._interpreted_code.attach(snapshot)  # the code its interpreter frames name, read while they live

    def check_unreachable(self, limit: int = UNREACHABLE_LIMIT) -> UnreachableReport:
        """Which of the target's live allocations nothing reachable points to (it is frozen
        for a moment). A launched command's allocations are all known; an attached one's
        made before the trace are not. Raises RuntimeFailure if the target cannot be frozen."""
        if self._exited:
            raise RuntimeFailure(f"pid {self.pid} has exited: nothing to check")
        from leaktrace.reachability.unreachable import find_unreachable  # numpy: 50 ms of start-up, only for this

        info = read_process(self.target.single_pid)
        if info is None:
            raise RuntimeFailure(f"pid {self.pid} has exited: nothing to check")
        return find_unreachable(
            info,
            self.engine.reader.allocations({self.pid}),
            complete=self.target.is_command,
            limit=limit,
            allocator=self.engine.library_paths[0],
        )

    def poll(self) -> bool:
        """Notices stops and exits; returns False once the target is gone."""
        if self._exited:
            return False
        self.processes.track()
        if self.target.is_every_process:
            return True  # a systemwide trace runs until it is stopped
        running = self._poll_child() if self.target.is_command else self._poll_attached()
        if not running:
            if not self._exited:
                self._finish()
            return False
        self.processes.refresh_infos(MAPS_REFRESH)
        return True

    def _poll_child(self) -> bool:
        """-c's command: running; stopped by the BPF program, served and let go; False once ended."""
        child = self.target.single_pid
        state = self.life.look(stops=True)
        if state is TargetState.STOPPED:
            if self.engine.kernel.tables_stop_pending():
                # Stopped at the first allocator call of a new image: its modules are all
                # mapped now; the call goes on once their unwind tables are in.
                self.processes.process_info(child)
                self.engine.kernel.clear_tables_stop(self.engine.kernel.target_gen())
                self._stop_owners.let_go(child)
            elif self.engine.kernel.interpreter_stop_pending():
                self._read_interpreted_code()
                self.engine.kernel.clear_interpreter_stop()
                self._stop_owners.let_go(child)
            elif self.engine.kernel.exit_stop_pending():
                # Stopped in _exit by the BPF program: every free has run, maps are intact;
                # children it reaped since this poll began are taken leave of first.
                self.processes.track()
                self.final_snapshot = self.snapshot(
                    with_allocations=self.engine.settings.exit_allocations or self.leak_check_at_exit
                )
                if self.leak_check_at_exit:  # after the children judged at their own exits
                    judged = self.final_snapshot.leak_checks + self._judge_at_exit()
                    self.final_snapshot = dataclasses.replace(self.final_snapshot, leak_checks=judged)
                # Its allocator's file is read now, while its maps still lead to it.
                self._unprobed_at_exit = self._allocator_not_probed(self.processes.process_info(child))
                self.engine.kernel.clear_exit_stop()
                self._stop_owners.let_go(child)
        return state is not TargetState.ENDED

    def _poll_attached(self) -> bool:
        """-p's process: alive; stopped where its interpreter frees its code, the code its frames
        name is read and it goes on."""
        pid = self.target.single_pid
        if self.engine.kernel.interpreter_stop_pending() and process_state(pid) == "T":
            self._read_interpreted_code()
            self.engine.kernel.clear_interpreter_stop()
            self._stop_owners.let_go(pid)
        return self.life.look() is not TargetState.ENDED

    def _read_interpreted_code(self) -> None:
        """Stopped where its interpreter frees its code: the code its stacks' interpreter frames
        name is read now, before it is freed, for the reports to come (the one at its exit too)."""
        pids = self.processes.traced_pids()
        processes = {pid: self.processes.process_info(pid) for pid in pids}
        groups = self.engine.reader.groups(None, set(pids))
        self._interpreted_code.attach(Snapshot(time.time(), tuple(groups), Counters(), processes))

    @property
    def leak_check_at_exit(self) -> bool:
        """Judge valgrind's leak kinds at exit (EngineSettings.leak_check_at_exit): -c's command at
        its exit stop; with fork following (-f, --all), each other process whose every block is
        known, held in _exit."""
        return self.engine.settings.leak_check_at_exit

    def _judge_exit(self, pid: int, gen: int) -> None:
        """A process held in _exit: its blocks judged (all known: it was traced from its exec or
        start, or forked from such a one), for the next snapshot, with its command line."""
        from leaktrace.reachability.unreachable import judge_leak_kinds

        record = self._selected_image(pid, gen)
        if record is None:
            return
        self.processes.judged.add((pid, gen))
        info = read_process(pid)
        if info is None:
            return
        info = dataclasses.replace(info, forked=record.forked)
        self.processes.infos[pid] = info  # its frames are named from these maps
        if self.engine.settings.follow_forks:
            self.engine.inheritance.copy_inherited()  # a child that exits at once may not have its copies yet
        check = judge_leak_kinds(info, self.engine.reader.allocations(images={pid: gen}), self.engine.exit_hold_spots)
        self._exit_checks.append(named_by_command_line(check, pid, info.name))

    def check_leak_kinds(self) -> LeakCheck:
        """valgrind's kinds of every block the attached process has now (frozen a moment): those
        made before the trace from glibc's heap walk. RuntimeFailure where it cannot be judged."""
        from leaktrace.reachability.unreachable import judge_leak_kinds_walked

        info = read_process(self.target.single_pid) if not self._exited else None
        if info is None:
            raise RuntimeFailure(f"pid {self.pid} has exited: nothing to judge")
        return judge_leak_kinds_walked(info, self.engine.reader.allocations({self.pid}), self.engine.library_paths[0])

    def _judge_at_exit(self) -> tuple[LeakCheck, ...]:
        """valgrind's leak kinds of every block the command still has, judged while it stands
        in _exit (every block known: it was traced from its start); none, said, if it cannot be."""
        from leaktrace.reachability.unreachable import judge_leak_kinds  # numpy: only for this

        assert self.final_snapshot is not None and self.final_snapshot.allocations is not None
        processes, allocations = self.final_snapshot.processes, list(self.final_snapshot.allocations)
        command = self.target.single_pid
        record = self.engine.reader.process(command)
        if record is not None:  # the image that stands in _exit
            self.processes.target_selected = self.processes.selection.matches(command, record)
        if not self.processes.target_selected:
            return ()
        return judged_at_exit(
            command,
            lambda: judge_leak_kinds(processes[command], allocations, self.engine.exit_hold_spots),
            self.engine.notices,
        )

    def _finish(self) -> None:
        self._exited = True
        if self.final_snapshot is None:
            self.processes.track()  # children that left since this poll began
            self.final_snapshot = self.snapshot(with_allocations=self.engine.settings.exit_allocations)
            self.processes.sweep()
        else:  # taken at the exit stop, while the process still existed
            self.processes.sweep()
            processes = dict(self.final_snapshot.processes)
            processes[self.target.single_pid] = self.processes.process_info(self.target.single_pid, alive=False)
            self.final_snapshot = dataclasses.replace(self.final_snapshot, processes=processes)
        last = self.final_snapshot.processes.get(self.target.single_pid)
        if self.target.is_command and self.processes.target_maps_gen != self.engine.kernel.target_gen():
            # An image that made no call through the probed library, so was never stopped for its
            # tables, and was gone before a poll read its maps (a program in another root).
            before = f" (exec'd by {last.name or last.comm})" if last else ""
            self.engine.notices.append(
                f"the command's last program{before} never called the traced allocator, so nothing of it was "
                "traced (a program of another root, or a static one): trace it with -p, or name its "
                "allocator library with --lib"
            )
        elif self.target.is_command and last is not None and last.maps:
            unseen = self._unprobed_at_exit or self._allocator_not_probed(last)
            if unseen:  # a script that exec'd a program of another allocator (redis-server: jemalloc)
                self.engine.notices.append(
                    f"the command's last program ({last.name or last.comm}) allocated through {unseen},"
                    f" which was not traced: name it with --lib"
                )

    def _allocator_not_probed(self, last: ProcessInfo) -> str | None:
        """The allocator library a process's image used, when it is not one the probes are on."""
        try:
            used = allocator_library_of_process(last, ModuleFiles())
        except (RuntimeFailure, ElfError):
            return None
        return None if used.identity in {elf.identity for elf in self.engine.libraries} else used.path

    def take_notices(self) -> list[str]:
        notices = self.engine.tables.take_notices() + self.engine.notices
        self.engine.notices.clear()  # the list the engine's parts add to
        if self._holds is not None:
            notices, self._holds.failures = notices + self._holds.failures, []
        unjudged = self.processes.take_unjudged()
        if unjudged:
            shown = ", ".join(map(str, unjudged[:UNJUDGED_SHOWN])) + (", ..." if len(unjudged) > UNJUDGED_SHOWN else "")
            notices.append(
                f"leak check: {len(unjudged)} process(es) exited without being held for it "
                f"(one with a terminal never is): pid {shown}"
            )
        return notices

    def startup_lines(self, what: str, verbose: bool) -> list[str]:
        placements = (
            [probe.placement.why for probe in self.engine.probes] + [p.why for p in self.engine.unprobed]
            if verbose
            else []
        )
        refused = self.engine.tables.cache_refused
        cache = [f"unwind table cache not used: {refused}"] if refused else []
        slow = sorted({probe.function for probe in self.engine.probes if probe.placement.single_stepped})
        cost = f", ~{HOST.single_step_us} us a call" if HOST.single_step_us else ""
        trapped = f" ({len(slow)} single-stepped{cost}: {', '.join(slow)}; -v says why)" if slow else ""
        live = f"tracing {what} through {', '.join(self.engine.library_names)}: {len(self.engine.probes)} probes live"
        everywhere = (
            [f"pid {self.pid}'s first thread has exited: its probes trap in every process that uses the library"]
            if self.engine.leader_exited
            else []
        )
        unfiltered = self.target.is_every_process or self.engine.settings.follow_forks or self.engine.leader_exited
        guests = valgrind_guests() if unfiltered else []
        if guests:
            everywhere.append(
                f"valgrind runs here (pid {', '.join(map(str, guests[:3]))}{', ...' if len(guests) > 3 else ''}): "
                "while this trace's probes are in the libraries it traces, a program under valgrind that "
                "reaches one stops with SIGTRAP (docs/ci.md)"
            )
        unshared = [UNSHARED_NOTICE] if "-DSTOP_OWNERS_SHARED=0" in stop_owners_cflags() else []
        # One line names every feature this kernel lacks that this trace uses, and what doing without costs.
        off = features_off(bool(self.engine.settings.sampling.rate))
        kernel = [f"on Linux {os.uname().release}: " + "; ".join(off)] if off else []
        blind = [
            f"leak check on {family.name}: {family.gate_blind_spot}"
            for family in self.engine.families
            if family.gate_blind_spot and self.leak_check_at_exit
        ]
        return placements + cache + everywhere + unshared + kernel + blind + self.take_notices() + [live + trapped]

    @property
    def pid(self) -> int | None:
        """The one process traced (None: every process)."""
        return self.target.pid

    @property
    def exited(self) -> bool:
        return self._exited

    @property
    def exit_status(self) -> int | None:
        return self.life.exit_status

    @property
    def target_selected(self) -> bool:
        """False once the selection left the target out (-f --comm ...)."""
        return self.processes.target_selected

    def _selected_image(self, pid: int, gen: int) -> TracedProcess | None:
        """The record of a held program when it is this image of a process the trace keeps, else
        None; one outside the selection is left out at once (never held again, at its exit either)."""
        record = self.engine.reader.process(pid)
        if record is None or record.gen != gen or record.ignored:
            return None
        if not self.processes.selection.matches(pid, record):
            self.engine.registry.ignore({pid: gen})
            return None
        return record

    def _serve_hold(self, pid: int, gen: int) -> None:
        """Loads the tables of a program held at its first allocator call, unless it is outside
        the selection (then it is only continued, and left out at the next poll)."""
        if self._selected_image(pid, gen) is None:
            return
        info = read_process(pid)
        if info is None or not info.maps:
            return
        maps = MapsFollower()
        maps.follow(info.maps)
        self.engine.upload.load_tables(info, gen, maps)
        self.processes.image_held(info)

    def close(self) -> None:
        """Detaches every probe; a launched command is let go (and continued if stopped, unless
        another leaktrace holds it), and so is every program this trace stopped."""
        holds, self._holds = self._holds, None
        if holds is not None:
            self.engine.kernel.stop_holding()
            holds.close()
        self.engine.close()
        if self.target.is_command and not self._exited:
            self._stop_owners.let_go(self.target.single_pid)
        self._stop_owners.close()
        if self._stop_release is not None:
            self._stop_release.release()
