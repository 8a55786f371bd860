"""The BPF engine: compiles bpf/leaktrace.bpf.c with bcc, attaches it, reads its maps."""
from __future__ import annotations

import contextlib
import ctypes as ct
import importlib.resources
import os
import struct
import tempfile
import time
from collections import Counter as Tally
from dataclasses import dataclass

from .bpf_maps import dump_map
from .elf import ElfError, ElfFile
from .errors import RuntimeFailure
from .malloc_options import SIZE_MAX
from .snapshot import AllocationGroup, Counters, LiveAllocation, StackStatus

STACK_NONE, STACK_LOST = 0, 1
CTL_ARMED, CTL_EXIT_STOP = 0, 1

# Allocator function -> (entry program, has a return probe).
PROBES = {
    "malloc": ("malloc_enter", True),
    "calloc": ("calloc_enter", True),
    "realloc": ("realloc_enter", True),
    "reallocarray": ("reallocarray_enter", True),
    "free": ("free_enter", False),
    "posix_memalign": ("posix_memalign_enter", True),
    "aligned_alloc": ("aligned_alloc_enter", True),
    "memalign": ("aligned_alloc_enter", True),
    "valloc": ("valloc_enter", True),
    "pvalloc": ("pvalloc_enter", True),
}
# The BPF program's counter indexes, in order, as Counters fields.
COUNTER_FIELDS = ("allocations", "frees", "live_map_full", "site_map_full", "stack_map_full",
                  "stack_collisions", "stack_walk_errors", "pending_map_full", "stale_calls",
                  "unknown_frees", "internal_frees", "missed_frees", "nested_calls")


@dataclass(frozen=True)
class EngineSettings:
    stack_depth: int = 16            # malloc_debug's backtrace=N
    size_min: int = 0                # sizes in [size_min, size_max] get a stack
    size_max: int = SIZE_MAX
    max_live: int = 1_200_000        # live allocations held
    max_sites: int = 262_144         # distinct (pid, stack, size)
    max_stacks: int = 65_536         # distinct stacks
    max_pending: int = 16_384        # threads inside an allocator call at once


@dataclass(frozen=True)
class AttachedProbe:
    function: str
    address: int
    aliases: tuple[str, ...] = ()


def bpf_source() -> str:
    return importlib.resources.files("leaktrace.bpf").joinpath("leaktrace.bpf.c").read_text()


@contextlib.contextmanager
def _stderr_to(file):
    """Redirects fd 2 (where bcc and clang print) into file for the duration."""
    saved = os.dup(2)
    os.dup2(file.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _first_error_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if "error" in line.lower():
            return line
    return lines[-1] if lines else "unknown error"


class BpfEngine:
    """One compiled BPF program tracing one process (or all, with target 0)."""

    def __init__(self, settings: EngineSettings, target: int, library: str,
                 arm_on_exec: bool = False, stop_library: str | None = None):
        self.settings = settings
        self.target = target
        self.library = library
        self.arm_on_exec = arm_on_exec
        self.stop_library = stop_library     # library with _exit, to stop the target there
        self.probes: list[AttachedProbe] = []
        self._bpf = None
        self._text_around_free = (0, 0)
        self._stack_cache: dict[int, tuple[int, ...]] = {}

    def _cflags(self) -> list[str]:
        s = self.settings
        return [f"-DTARGET_TGID={self.target}", f"-DSTACK_DEPTH={s.stack_depth}",
                f"-DLT_SIZE_MIN={s.size_min}ULL", f"-DLT_SIZE_MAX={s.size_max}ULL",
                f"-DPAGE_BYTES={os.sysconf('SC_PAGE_SIZE')}", f"-DMAX_LIVE={s.max_live}",
                f"-DMAX_SITES={s.max_sites}", f"-DMAX_STACKS={s.max_stacks}",
                f"-DMAX_PENDING={s.max_pending}",
                f"-DTEXT_BEFORE_FREE={self._text_around_free[0]}ULL",
                f"-DTEXT_AFTER_FREE={self._text_around_free[1]}ULL"]

    def _compile(self):
        from bcc import BPF
        with tempfile.TemporaryFile(mode="w+") as log:
            try:
                with _stderr_to(log):
                    return BPF(text=bpf_source().encode(), cflags=self._cflags())
            except Exception as e:   # bcc raises bare Exception
                log.seek(0)
                raise RuntimeFailure(f"cannot load the BPF program: {_first_error_line(log.read() or str(e))}") from None

    def _attach_uprobe(self, library: str, address: int, fn_name: str, ret: bool) -> None:
        attach = self._bpf.attach_uretprobe if ret else self._bpf.attach_uprobe
        pid = self.target or -1
        try:
            with tempfile.TemporaryFile(mode="w+") as log, _stderr_to(log):
                attach(name=library.encode(), addr=address, fn_name=fn_name.encode(), pid=pid)
        except Exception as e:
            if self.target and not os.path.exists(f"/proc/{self.target}"):
                raise RuntimeFailure(f"pid {self.target} exited before the probes were attached") from None
            raise RuntimeFailure(f"cannot attach a uprobe to {library}: {e}") from None

    def start(self) -> None:
        """Compiles, arms (unless waiting for exec) and attaches every probe."""
        try:
            elf = ElfFile(self.library)
            functions = elf.dynamic_functions
        except ElfError as e:
            raise RuntimeFailure(f"cannot read allocator library: {e}") from None
        if "malloc" not in functions or "free" not in functions:
            raise RuntimeFailure(f"{self.library} does not export malloc and free")
        text = elf.segment_containing(functions["free"])
        if text is not None:
            self._text_around_free = (functions["free"] - text.vaddr, text.vaddr + text.memsz - functions["free"])
        self._bpf = self._compile()
        if not self.arm_on_exec:
            self._set_control(CTL_ARMED, 1)
        else:
            self._bpf.attach_raw_tracepoint(tp=b"sched_process_exec", fn_name=b"exec_arm")
        by_address: dict[int, AttachedProbe] = {}
        for function, (program, has_return) in PROBES.items():
            address = functions.get(function)
            if address is None:
                continue
            known = by_address.get(address)
            if known is not None:
                # An alias of a function already probed (glibc: memalign = aligned_alloc).
                if PROBES[known.function][0] != program:
                    raise RuntimeFailure(f"{self.library}: {function} and {known.function} share an address")
                by_address[address] = AttachedProbe(known.function, address, known.aliases + (function,))
                continue
            self._attach_uprobe(self.library, address, program, ret=False)
            if has_return:
                self._attach_uprobe(self.library, address, "alloc_return", ret=True)
            by_address[address] = AttachedProbe(function, address)
        self.probes = list(by_address.values())
        if self.stop_library:
            exit_address = ElfFile(self.stop_library).dynamic_functions.get("_exit")
            if exit_address:
                self._attach_uprobe(self.stop_library, exit_address, "exit_stop", ret=False)

    def _set_control(self, slot: int, value: int) -> None:
        self._bpf[b"control"][ct.c_int(slot)] = ct.c_uint32(value)

    def exit_stop_pending(self) -> bool:
        """True once the target has been stopped in _exit by the BPF program."""
        return bool(self._bpf[b"control"][ct.c_int(CTL_EXIT_STOP)].value)

    def clear_exit_stop(self) -> None:
        self._set_control(CTL_EXIT_STOP, 0)

    def counters(self) -> Counters:
        table = self._bpf[b"counters"]
        totals = [sum(table[ct.c_int(i)]) for i in range(len(COUNTER_FIELDS))]
        return Counters(**dict(zip(COUNTER_FIELDS, totals)))

    def _stack(self, key: int) -> tuple[int, ...]:
        frames = self._stack_cache.get(key)
        if frames is None:
            try:
                raw = self._bpf[b"stacks"][ct.c_uint64(key)]
            except KeyError:
                return ()
            frames = tuple(ip for ip in raw.ip if ip)
            # The kernel adds the caller itself when the probed instruction is push %rbp or endbr64.
            if len(frames) > 1 and frames[0] == frames[1]:
                frames = frames[1:]
            self._stack_cache[key] = frames
        return frames

    def _stack_of(self, stack_key: int) -> tuple[tuple[int, ...], StackStatus]:
        if stack_key == STACK_NONE:
            return (), StackStatus.FILTERED
        frames = self._stack(stack_key) if stack_key != STACK_LOST else ()
        return frames, StackStatus.CAPTURED if frames else StackStatus.LOST

    def _live_entries(self):
        """(tgid, address, size, ts_ns, stack_key) of every live allocation."""
        keys, values, _ = dump_map(self._bpf[b"live"])
        for (tgid, _, address), (size, ts_ns, stack_key) in zip(struct.iter_unpack("<IIQ", keys),
                                                                 struct.iter_unpack("<QQQ", values)):
            yield tgid, address, size, ts_ns, stack_key

    def groups(self, older_than_ns: int | None = None) -> list[AllocationGroup]:
        """Live allocations grouped by (pid, size, stack).

        Without an age limit this reads only the per-site counts; with one it
        walks every live allocation and keeps those older than the limit.
        """
        tally: Tally[tuple[int, int, int]] = Tally()
        if older_than_ns is None:
            keys, values, _ = dump_map(self._bpf[b"sites"])
            for (tgid, _, stack_key, size), (count,) in zip(struct.iter_unpack("<IIQQ", keys),
                                                            struct.iter_unpack("<q", values)):
                if count > 0:
                    tally[tgid, stack_key, size] += count
        else:
            cutoff = time.monotonic_ns() - older_than_ns
            for tgid, _, size, ts_ns, stack_key in self._live_entries():
                if ts_ns <= cutoff:
                    tally[tgid, stack_key, size] += 1
        return [AllocationGroup(tgid, size, count, *self._stack_of(key))
                for (tgid, key, size), count in tally.items()]

    def allocations(self) -> list[LiveAllocation]:
        """Every live allocation with its address (a walk of the whole live table)."""
        return [LiveAllocation(tgid, address, size, *self._stack_of(key))
                for tgid, address, size, _, key in self._live_entries()]

    def close(self) -> None:
        """Detaches every probe and frees the maps; safe to call twice."""
        if self._bpf is not None:
            bpf, self._bpf = self._bpf, None
            with tempfile.TemporaryFile(mode="w+") as log, _stderr_to(log):
                bpf.cleanup()
