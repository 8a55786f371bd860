"""The processes a BPF trace follows (forked children, every process of --all): their maps
and unwind tables kept current, those the selection leaves out ignored, exited ones taken
leave of (their last records reported once) and their records swept from the kernel tables."""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from leaktrace.model.snapshot import AllocationGroup, LiveAllocation, Peak, ProcessInfo, SiteTotals
from leaktrace.platform.process import MapsFollower, read_process
from leaktrace.sources.bpf.engine import BpfEngine
from leaktrace.sources.bpf.map_reading import TracedProcess


@dataclass(frozen=True)
class Selection:
    """Which processes a systemwide trace (or -f's) keeps (all of them when every field is empty)."""

    pids: frozenset[int] = frozenset()
    comm: re.Pattern | None = None  # searched in the 15-character comm
    uid: int | None = None  # real uid
    exe: str | None = None  # a glob the executable's path, or its name, matches

    def matches(self, pid: int, process: TracedProcess) -> bool:
        return (
            (not self.pids or pid in self.pids)
            and (self.comm is None or self.comm.search(process.comm) is not None)
            and (self.uid is None or process.uid == self.uid)
            and (self.exe is None or executable_matches(pid, self.exe))
        )


def executable_matches(pid: int, pattern: str) -> bool:
    """Whether the program pid runs (its /proc exe link, a path only compared) matches the
    glob, whole or by its last component; a process gone or hidden matches nothing."""
    try:
        path = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    return fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(os.path.basename(path), pattern)


class Departed(NamedTuple):
    """What a process that exited left in the maps, read before the sweep drops it."""

    info: ProcessInfo
    groups: list[AllocationGroup]
    allocations: list[LiveAllocation]
    sites: list[SiteTotals]
    peaks: list[Peak]


class ProcessTracker:
    """The processes a BpfTrace follows, a part it owns (the engine's target's and, with -f
    or --all, the others it follows):
    their infos and maps, the images seen, the exited ones' last records, the sweeps."""

    def __init__(
        self,
        engine: BpfEngine,
        selection: Selection,
        info: ProcessInfo | None,
        target_exited: Callable[[], bool],
    ) -> None:
        self.engine, self.selection = engine, selection
        self._target_exited = target_exited  # the trace's word: the target is gone (its infos are kept)
        self.target_selected = True  # False once the selection left the target out (-f --comm ...)
        self.infos: dict[int, ProcessInfo] = {info.pid: info} if info is not None else {}
        self.target_maps_gen = 0  # the target's image whose maps were read last (0: none yet)
        self._maps: dict[int, MapsFollower] = {}  # pid -> its maps as last read
        self._forked: set[int] = set()  # forked from a traced process, same image (ProcessInfo.forked)
        self._info_read_at = time.monotonic()
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
        self._departed: list[Departed] = []
        # --leak-check: the images judged in _exit, and those of whole processes that exited unjudged.
        self.judged: set[tuple[int, int]] = set()
        self._unjudged: list[int] = []

    @property
    def pid(self) -> int | None:
        """The one target process (None: every process is traced alike)."""
        return self.engine.target.pid

    def process_info(self, pid: int, alive: bool = True) -> ProcessInfo:
        alive = alive and not (pid == self.pid and self._target_exited())
        if alive:
            info = read_process(pid)
            if info is not None and info.maps:
                maps = self._maps.setdefault(pid, MapsFollower())
                maps.follow(info.maps)
                info = dataclasses.replace(info, forked=pid in self._forked, unmapped=maps.unmapped)
                self.infos[pid] = info
                self._load_tables(info, maps)
                return info
        cached = self.infos.get(pid) or ProcessInfo(pid)
        # Unreadable but not known to be gone (a zombie): exited is for trace.poll to say.
        return cached if alive else dataclasses.replace(cached, exited=True)

    def _load_tables(self, info: ProcessInfo, maps: MapsFollower) -> None:
        """The stack walk's view of a process's executable mappings, kept current as they change
        (the target's current image as the kernel side has it: an exec may be newer than _gens)."""
        gen = self.engine.kernel.target_gen() if info.pid == self.pid else self._gens.get(info.pid, 0)
        if info.pid == self.pid:
            self.target_maps_gen = gen
        if gen:
            self.engine.upload.load_tables(info, gen, maps)

    def _departed_info(self, pid: int, known: dict[int, TracedProcess]) -> ProcessInfo:
        """What is known of an exited child, even one that lived and died between two polls:
        then its name comes from the kernel side and, unless it exec'd, its maps from its parent
        (known: the kernel side's records, which exited processes leave at once)."""
        info = self.process_info(pid, alive=False)
        recorded = known.get(pid)
        if info.maps or recorded is None:
            return info
        comm, parent, execed, forked = recorded.comm, recorded.parent, recorded.execed, recorded.forked
        while not execed and parent:  # up through ancestors that were never read either
            if parent in self.infos:
                return dataclasses.replace(self.infos[parent], pid=pid, comm=comm, exited=True, forked=forked)
            ancestor = known.get(parent)
            parent, execed = (ancestor.parent, ancestor.execed) if ancestor else (0, True)
        return dataclasses.replace(info, comm=comm, name=comm, forked=forked)

    def image_held(self, info: ProcessInfo) -> None:
        """A new image's process as read at its hold (its first allocator call): what its frames
        are named from should it exit unread, in place of what an earlier image of the pid left."""
        cached = self.infos.get(info.pid)
        if cached is None or cached.maps != info.maps:
            self.infos[info.pid] = info
            self._maps.pop(info.pid, None)

    def refresh_infos(self, older_than: float) -> None:
        """Keeps recent maps of every traced process, to symbolize one that dies without warning:
        read again once those read are older than older_than seconds."""
        if time.monotonic() - self._info_read_at <= older_than:
            return
        for pid in self.traced_pids():
            self.process_info(pid)
        self._info_read_at = time.monotonic()

    def traced_pids(self) -> list[int]:
        """The target first, then the children followed (fork following only); or every traced process."""
        children = sorted(self._gens) if self.engine.settings.follow_forks else []
        return ([self.pid] if self.pid is not None else []) + [pid for pid in children if pid != self.pid]

    def track(self) -> None:
        """Copies what new children inherited; leaves out processes outside the selection; takes
        leave of exited children (out of the process tables at once, their records read at the
        next snapshot or sweep); sweeps the records of those and of replaced images."""
        if self.engine.settings.follow_forks:
            self.engine.inheritance.copy_inherited()
        known = self.engine.reader.processes()
        # New images (first seen, or exec'd) that the selection leaves out are not traced further.
        unselected = {
            pid: p.gen
            for pid, p in known.items()
            if not p.ignored and self._gens.get(pid) != p.gen and not self.selection.matches(pid, p)
        }
        if self.pid is not None and self.pid in known:
            target = known[self.pid]
            if not target.ignored and self._gens.get(self.pid) != target.gen:
                self.target_selected = self.pid not in unselected  # each image of the target judged anew
        if unselected:
            self.engine.registry.ignore(unselected)
        traced = {pid: p for pid, p in known.items() if not p.ignored and pid not in unselected}
        gone = {pid: p for pid, p in known.items() if p.exited and pid != self.pid}
        if self.engine.settings.leak_check_at_exit:
            self._unjudged += [
                pid for pid, p in gone.items() if pid in traced and p.whole and (pid, p.gen) not in self.judged
            ]
            self.judged -= {(pid, p.gen) for pid, p in gone.items()}  # an image is judged at most once
        for pid, p in gone.items():
            if pid in traced:
                self._gone[pid] = (p.gen, self._departed_info(pid, known))
            else:  # left out: nothing of it is reported
                self._exited_images[pid] = p.gen
            self.infos.pop(pid, None)
            self._maps.pop(pid, None)
        if gone:
            self.engine.registry.drop_processes(set(gone))
        replaced = any(self._gens.get(pid, p.gen) != p.gen for pid, p in traced.items())
        self._sweep_due |= bool(gone or replaced or unselected)
        new_images = [pid for pid, p in traced.items() if self._gens.get(pid) != p.gen and pid not in gone]
        self._gens = {pid: p.gen for pid, p in traced.items() if pid not in gone}
        self._forked = {pid for pid, p in traced.items() if p.forked}
        # New images (new processes, or exec'd): read now, in case they are short-lived, and
        # so that their stacks are walked from their modules' tables from now on.
        for pid in new_images:
            self.process_info(pid)
        if time.monotonic() - self._swept_at >= self._sweep_pause:
            self.sweep()

    def _read_departed(self) -> None:
        """Reads the records of the processes that exited since this was last done, in one go:
        they are reported at the next snapshot, and the next sweep may drop them."""
        if not self._gone:
            return
        images = {pid: gen for pid, (gen, _) in self._gone.items()}
        groups: dict[int, list] = {pid: [] for pid in images}
        allocations: dict[int, list] = {pid: [] for pid in images}
        for group in self.engine.reader.groups(images=images):
            groups[group.pid].append(group)
        for allocation in (
            self.engine.reader.allocations(images=images) if self.engine.settings.exit_allocations else ()
        ):
            allocations[allocation.pid].append(allocation)
        sites, peaks = self.engine.reader.sites_and_peaks(images=images)
        for pid in sorted(images):
            self._departed.append(
                Departed(
                    self._gone[pid][1],
                    groups[pid],
                    allocations[pid],
                    [site for site in sites if site.pid == pid],
                    [peak for peak in peaks if peak.pid == pid],
                )
            )
        self._exited_images.update(images)
        self._gone = {}

    def take_departed(self) -> list[Departed]:
        """The last states of the processes that exited since the last take (read now where
        not yet): each shown once."""
        self._read_departed()
        departed, self._departed = self._departed, []
        return departed

    def take_unjudged(self) -> list[int]:
        """--leak-check: the whole processes that exited unjudged since the last take."""
        unjudged, self._unjudged = self._unjudged, []
        return unjudged

    def sweep(self) -> None:
        """Reads what exited processes left, then drops their records and replaced images'."""
        self._read_departed()
        if self._sweep_due:
            started = time.monotonic()
            self.engine.registry.sweep(self._exited_images)
            self._exited_images, self._sweep_due, self._swept_at = {}, False, time.monotonic()
            self._sweep_pause = max(1.0, 10 * (self._swept_at - started))
