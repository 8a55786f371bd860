"""The Python API under the CLI: trace a process, take snapshots, end cleanly.

with Trace.launch(["./prog"]) as trace:
    trace.wait()
report = render_text(Symbolizer().symbolize(trace.final_snapshot))
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from leaktrace.errors import RuntimeFailure
from leaktrace.model.snapshot import UNREACHABLE_LIMIT, ProcessInfo, Snapshot, UnreachableReport
from leaktrace.platform.elf import ElfError, ElfFile
from leaktrace.platform.module_files import ModuleFiles, allocator_library_of_process, libc_libraries
from leaktrace.platform.process import (
    alive,
    library_of_executable,
    program_loader,
    read_process,
    read_target,
    resolve_executable,
    unmapped_mappings,
)
from leaktrace.platform.system import check_system
from leaktrace.sources.bpf.engine import BpfEngine, EngineSettings
from leaktrace.sources.bpf.map_reading import TracedProcess
from leaktrace.sources.protocol import PollingSource

MAPS_REFRESH = 0.2  # seconds between reads of traced processes' maps (dlopen'ed modules get tables)


def _spawn_gated(path: str, argv: list[str]) -> tuple[int, int, int]:
    """Forks a child that execs argv once the gate is written; returns (pid, gate, errors)."""
    gate_r, gate_w = os.pipe()
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # child: nothing here may raise past os._exit
        try:
            os.close(gate_w)
            os.close(err_r)
            os.read(gate_r, 1)
            os.close(gate_r)
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            os.execv(path, argv)
        except OSError as e:
            os.write(err_w, os.strerror(e.errno).encode())
        finally:
            os._exit(127)
    os.close(gate_r)
    os.close(err_w)
    return pid, gate_w, err_r


# Run by a process of its own (a SIGKILL of leaktrace does not reach it, nor terminal signals):
# when leaktrace dies without letting its command go, the BPF program may have left the
# command stopped (SIGSTOP at _exit or at a new image's first allocator call): it is
# continued, again and again for as long as leaktrace's links may take to be detached.
_CONTINUER = """
import os, signal, sys, time
command, leaktrace = int(sys.argv[1]), int(sys.argv[2])
if os.read(leaktrace, 1):
    sys.exit(0)
deadline = time.monotonic() + 2
while time.monotonic() < deadline:
    try:
        signal.pidfd_send_signal(command, signal.SIGCONT)
    except ProcessLookupError:
        break
    time.sleep(0.02)
"""


class StopRelease:
    """Makes sure a command the BPF program may stop is continued if leaktrace dies: a small
    process holds a pidfd of the command and the read end of a pipe only leaktrace writes;
    leaktrace's death closes the pipe, and the command is sent SIGCONT. release() says the
    command was let go (nothing to do)."""

    def __init__(self, pid: int):
        pidfd = os.pidfd_open(pid)
        read_end, self._write_end = os.pipe2(os.O_CLOEXEC)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _CONTINUER, str(pidfd), str(read_end)],
                pass_fds=(pidfd, read_end),
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        finally:
            os.close(pidfd)
            os.close(read_end)

    def release(self) -> None:
        if self._write_end >= 0:
            os.write(self._write_end, b"x")
            os.close(self._write_end)
            self._write_end = -1
            self._process.wait()


@dataclass(frozen=True)
class Selection:
    """Which processes a systemwide trace keeps (all of them when every field is empty)."""

    pids: frozenset[int] = frozenset()
    comm: re.Pattern | None = None  # searched in the 15-character comm
    uid: int | None = None  # real uid

    def matches(self, pid: int, process: TracedProcess) -> bool:
        return (
            (not self.pids or pid in self.pids)
            and (self.comm is None or self.comm.search(process.comm) is not None)
            and (self.uid is None or process.uid == self.uid)
        )


def _library(path: str) -> ElfFile:
    """An allocator library the user named (or the program's loader found)."""
    try:
        return ElfFile(path)
    except ElfError as e:
        raise RuntimeFailure(f"cannot read allocator library: {e}") from None


def _started_or_closed(engine: BpfEngine) -> BpfEngine:
    """The engine, started; closed again (nothing left attached) if starting fails."""
    try:
        engine.start()
    except BaseException:
        engine.close()
        raise
    return engine


class Trace(PollingSource):
    """A BPF trace of one process (pid), or of every process (pid 0); a context manager
    that always detaches."""

    def __init__(
        self, engine: BpfEngine, pid: int, info: ProcessInfo | None, is_child: bool, selection: Selection = Selection()
    ):
        self.engine = engine
        self.selection = selection
        # Set to make the final snapshot list every live pointer (for the exit leak log).
        self.final_with_allocations = False
        self.logs_own_leaks = False
        self.pid = pid
        self.is_child = is_child
        self.final_snapshot: Snapshot | None = None
        self.exit_status: int | None = None
        self._infos: dict[int, ProcessInfo] = {pid: info} if info is not None else {}
        self._forked: set[int] = set()  # forked from a traced process, same image (ProcessInfo.forked)
        self._info_read_at = time.monotonic()
        self._exited = False
        self._gens: dict[int, int] = {}  # traced pid -> image generation, as last seen
        # Processes that exited leave the process tables at once; their records are read in one
        # go at the next snapshot or sweep (_gone), and dropped by the sweep after (_exited_images).
        # A sweep walks the live table (about 1 s per million records), so it waits at least a
        # second and ten times its last duration: at most a tenth of a CPU.
        self._gone: dict[int, tuple[int, ProcessInfo]] = {}  # pid -> (generation, what is known of it)
        self._exited_images: dict[int, int] = {}  # pid -> the last generation to drop
        self._sweep_due = False
        self._swept_at = 0.0
        self._sweep_pause = 1.0
        # Children that exited since the last snapshot: their last state, shown once.
        self._departed: list[tuple[ProcessInfo, list, list]] = []
        self._stop_release: StopRelease | None = None  # a launched command, continued if leaktrace dies

    # -- starting -----------------------------------------------------------

    @classmethod
    def attach(cls, pid: int, settings: EngineSettings = EngineSettings(), library: str | None = None) -> Trace:
        """Traces a running process from now on."""
        check_system()
        if pid == os.getpid():
            raise RuntimeFailure("leaktrace cannot trace itself")
        info = read_target(pid)
        elf = _library(library) if library else allocator_library_of_process(info, ModuleFiles())
        return cls(_started_or_closed(BpfEngine(settings, pid, (elf,))), pid, info, is_child=False)

    @classmethod
    def launch(cls, argv: list[str], settings: EngineSettings = EngineSettings(), library: str | None = None) -> Trace:
        """Starts argv with the probes already live: none of its allocations is missed."""
        check_system()
        path = resolve_executable(argv[0])
        library = library or library_of_executable(path)
        libc = library_of_executable(path, "_exit") if library != path else None
        elf = _library(library)
        pid, gate, errors = _spawn_gated(path, argv)
        engine = BpfEngine(
            settings, pid, (elf,), arm_on_exec=True, stop_library=libc or library, loader=program_loader(path)
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
            _reap(pid, kill=True)
            release.release()
            raise
        trace = cls(engine, pid, read_process(pid), is_child=True)
        trace._stop_release = release
        trace._await_first_tables()
        return trace

    def _await_first_tables(self, timeout: float = 2.0) -> None:
        """Polls until the launched command's first image has its unwind tables (its first
        allocator call waits for them), it exits, or timeout: a caller that polls rarely
        does not leave it stopped at its start."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.poll() and not self.engine.tables_loaded():
            time.sleep(0.002)

    @classmethod
    def everything(
        cls,
        settings: EngineSettings = EngineSettings(),
        libraries: tuple[str, ...] = (),
        selection: Selection = Selection(),
    ) -> Trace:
        """Traces every process that calls into a libc on this system (and into libraries),
        each from its first allocator call; children inherit as with follow_forks."""
        check_system()
        found = libc_libraries(ModuleFiles())
        named = [_library(path) for path in libraries]
        known = {elf.identity for elf in found}
        engine = BpfEngine(settings, 0, found + tuple(elf for elf in named if elf.identity not in known))
        return cls(_started_or_closed(engine), 0, None, is_child=False, selection=selection)

    # -- running ------------------------------------------------------------

    def _process_info(self, pid: int, alive: bool = True) -> ProcessInfo:
        alive = alive and not (pid == self.pid and self._exited)
        if alive:
            info = read_process(pid)
            if info is not None and info.maps:
                earlier = self._infos.get(pid)
                info = dataclasses.replace(
                    info,
                    forked=pid in self._forked,
                    unmapped=unmapped_mappings(earlier, info.maps) if earlier is not None else "",
                )
                self._infos[pid] = info
                self._load_tables(info)
                return info
        cached = self._infos.get(pid) or ProcessInfo(pid)
        # Unreadable but not known to be gone (a zombie): exited is for trace.poll to say.
        return cached if alive else dataclasses.replace(cached, exited=True)

    def _load_tables(self, info: ProcessInfo) -> None:
        """The stack walk's view of a process's executable mappings, kept current as they change
        (the target's current image as the kernel side has it: an exec may be newer than _gens)."""
        gen = self.engine.target_gen() if info.pid == self.pid else self._gens.get(info.pid, 0)
        if gen:
            self.engine.load_tables(info, gen)

    def _departed_info(self, pid: int, known: dict[int, TracedProcess]) -> ProcessInfo:
        """What is known of an exited child, even one that lived and died between two polls:
        then its name comes from the kernel side and, unless it exec'd, its maps from its parent
        (known: the kernel side's records, which exited processes leave at once)."""
        info = self._process_info(pid, alive=False)
        recorded = known.get(pid)
        if info.maps or recorded is None:
            return info
        comm, parent, execed, forked = recorded.comm, recorded.parent, recorded.execed, recorded.forked
        while not execed and parent:  # up through ancestors that were never read either
            if parent in self._infos:
                return dataclasses.replace(self._infos[parent], pid=pid, comm=comm, exited=True, forked=forked)
            ancestor = known.get(parent)
            parent, execed = (ancestor.parent, ancestor.execed) if ancestor else (0, True)
        return dataclasses.replace(info, comm=comm, name=comm, forked=forked)

    def _refresh_infos(self) -> None:
        """Keeps recent maps of every traced process, to symbolize one that dies without warning."""
        for pid in self._traced_pids():
            self._process_info(pid)
        self._info_read_at = time.monotonic()

    def _traced_pids(self) -> list[int]:
        """The target first, then the children followed (fork following only); or every traced process."""
        children = sorted(self._gens) if self.engine.settings.follow_forks else []
        return ([self.pid] if self.pid else []) + [pid for pid in children if pid != self.pid]

    def snapshot(self, older_than_ms: int | None = None, with_allocations: bool = False) -> Snapshot:
        """The live allocations now (or the final ones, once the target has exited).

        Children that exited since the previous snapshot appear in this one, once.
        """
        if self._exited and self.final_snapshot is not None and older_than_ms is None:
            return self.final_snapshot
        older_than_ns = None if older_than_ms is None else older_than_ms * 1_000_000
        self._read_departed()
        pids = self._traced_pids()
        processes = {pid: self._process_info(pid) for pid in pids}
        groups = self.engine.groups(older_than_ns, set(pids))
        allocations = self.engine.allocations(set(pids)) if with_allocations else None
        for info, departed_groups, departed_allocations in self._departed:
            processes[info.pid] = info
            groups += departed_groups
            if self.final_with_allocations:  # for their exit leak log, even when not asked for the rest
                allocations = (allocations or []) + departed_allocations
        self._departed = []
        return Snapshot(
            time.time(),
            tuple(groups),
            self.engine.counters(),
            processes,
            self.engine.settings.stack_depth,
            None if allocations is None else tuple(allocations),
        )

    def check_unreachable(self, limit: int = UNREACHABLE_LIMIT) -> UnreachableReport:
        """Which of the target's live allocations nothing reachable points to (it is frozen
        for a moment). A launched command's allocations are all known; an attached one's
        made before the trace are not. Raises RuntimeFailure if the target cannot be frozen."""
        if self._exited:
            raise RuntimeFailure(f"pid {self.pid} has exited: nothing to check")
        from leaktrace.reachability.unreachable import find_unreachable  # numpy: 50 ms of start-up, only for this

        info = read_process(self.pid)
        if info is None:
            raise RuntimeFailure(f"pid {self.pid} has exited: nothing to check")
        return find_unreachable(
            info,
            self.engine.allocations({self.pid}),
            complete=self.is_child,
            limit=limit,
            allocator=self.engine.library_paths[0],
        )

    def _track_processes(self) -> None:
        """Copies what new children inherited; leaves out processes outside the selection; takes
        leave of exited children (out of the process tables at once, their records read at the
        next snapshot or sweep); sweeps the records of those and of replaced images."""
        if self.engine.settings.follow_forks:
            self.engine.copy_inherited()
        known = self.engine.processes()
        # New images (first seen, or exec'd) that the selection leaves out are not traced further.
        unselected = {
            pid: p.gen
            for pid, p in known.items()
            if not p.ignored and self._gens.get(pid) != p.gen and not self.selection.matches(pid, p)
        }
        if unselected:
            self.engine.ignore(unselected)
        traced = {pid: p for pid, p in known.items() if not p.ignored and pid not in unselected}
        gone = {pid: p for pid, p in known.items() if p.exited and pid != self.pid}
        for pid, p in gone.items():
            if pid in traced:
                self._gone[pid] = (p.gen, self._departed_info(pid, known))
            else:  # left out: nothing of it is reported
                self._exited_images[pid] = p.gen
            self._infos.pop(pid, None)
        if gone:
            self.engine.drop_processes(set(gone))
        replaced = any(self._gens.get(pid, p.gen) != p.gen for pid, p in traced.items())
        self._sweep_due |= bool(gone or replaced or unselected)
        new_images = [pid for pid, p in traced.items() if self._gens.get(pid) != p.gen and pid not in gone]
        self._gens = {pid: p.gen for pid, p in traced.items() if pid not in gone}
        self._forked = {pid for pid, p in traced.items() if p.forked}
        # New images (new processes, or exec'd): read now, in case they are short-lived, and
        # so that their stacks are walked from their modules' tables from now on.
        for pid in new_images:
            self._process_info(pid)
        if time.monotonic() - self._swept_at >= self._sweep_pause:
            self._sweep()

    def _read_departed(self) -> None:
        """Reads the records of the processes that exited since this was last done, in one go:
        they are reported at the next snapshot, and the next sweep may drop them."""
        if not self._gone:
            return
        images = {pid: gen for pid, (gen, _) in self._gone.items()}
        groups: dict[int, list] = {pid: [] for pid in images}
        allocations: dict[int, list] = {pid: [] for pid in images}
        for group in self.engine.groups(images=images):
            groups[group.pid].append(group)
        for allocation in self.engine.allocations(images=images) if self.final_with_allocations else ():
            allocations[allocation.pid].append(allocation)
        for pid in sorted(images):
            self._departed.append((self._gone[pid][1], groups[pid], allocations[pid]))
        self._exited_images.update(images)
        self._gone = {}

    def _sweep(self) -> None:
        self._read_departed()
        if self._sweep_due:
            started = time.monotonic()
            self.engine.sweep(self._exited_images)
            self._exited_images, self._sweep_due, self._swept_at = {}, False, time.monotonic()
            self._sweep_pause = max(1.0, 10 * (self._swept_at - started))

    def poll(self) -> bool:
        """Notices stops and exits; returns False once the target is gone."""
        if self._exited:
            return False
        self._track_processes()
        if not self.pid:
            return True  # a systemwide trace runs until it is stopped
        running = self._poll_child() if self.is_child else alive(self.pid)
        if not running:
            if not self._exited:
                self._finish(None)
            return False
        if time.monotonic() - self._info_read_at > MAPS_REFRESH:
            self._refresh_infos()
        return True

    def _poll_child(self) -> bool:
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG | os.WUNTRACED)
        except ChildProcessError:  # reaped elsewhere (the API user waited for it)
            self._finish(None)
            return False
        if pid == 0:
            return True
        if os.WIFSTOPPED(status):
            if self.engine.tables_stop_pending():
                # Stopped at the first allocator call of a new image: its modules are all
                # mapped now; the call goes on once their unwind tables are in.
                self._process_info(self.pid)
                self.engine.clear_tables_stop(self.engine.target_gen())
                os.kill(self.pid, signal.SIGCONT)
            elif self.engine.exit_stop_pending():
                # Stopped in _exit by the BPF program: every free has run, maps are intact;
                # children it reaped since this poll began are taken leave of first.
                self._track_processes()
                self.final_snapshot = self.snapshot(with_allocations=self.final_with_allocations)
                self.engine.clear_exit_stop()
                os.kill(self.pid, signal.SIGCONT)
            return True
        self._finish(status)
        return False

    def _finish(self, status: int | None) -> None:
        if status is not None:
            self.exit_status = os.waitstatus_to_exitcode(status)
        self._exited = True
        if self.final_snapshot is None:
            self._track_processes()  # children that left since this poll began
            self.final_snapshot = self.snapshot(with_allocations=self.final_with_allocations)
            self._sweep()
        else:  # taken at the exit stop, while the process still existed
            self._sweep()
            processes = dict(self.final_snapshot.processes)
            processes[self.pid] = self._process_info(self.pid, alive=False)
            self.final_snapshot = dataclasses.replace(self.final_snapshot, processes=processes)

    def startup_lines(self, what: str, verbose: bool) -> list[str]:
        placements = [probe.placement.why for probe in self.engine.probes] if verbose else []
        return placements + [
            f"tracing {what} through {', '.join(self.engine.library_paths)}: {len(self.engine.probes)} probes live"
        ]

    @property
    def exited(self) -> bool:
        return self._exited

    def close(self) -> None:
        """Detaches every probe; a launched command is let go (and continued if stopped)."""
        self.engine.close()
        if self.is_child and not self._exited:
            try:
                os.kill(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if self._stop_release is not None:
            self._stop_release.release()


def _reap(pid: int, kill: bool) -> None:
    try:
        if kill:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
