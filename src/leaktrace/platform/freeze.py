"""Freezing a process for a moment: every thread stopped with PTRACE_SEIZE +
PTRACE_INTERRUPT (frozen()), then either read in place or, for a reachability check,
its registers and memory copied (freeze_and_copy()), and every thread released. A
copy is then swept with the process running.

If leaktrace dies while the threads are stopped, the kernel detaches them and they
run on (a seized thread in an interrupt stop resumes when its tracer goes).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from leaktrace.errors import RuntimeFailure
from leaktrace.platform.arch import HOST
from leaktrace.platform.process import (
    Mapping,
    alive,
    live_thread,
    parent_of,
    parse_maps,
    proc_path,
    status_field,
    zombie,
)
from leaktrace.platform.ptrace import (
    PTRACE_DETACH,
    PTRACE_INTERRUPT,
    PTRACE_SEIZE,
    REGS,
    WALL,
    BlockedCall,
    call_at_stop,
    call_before_interrupt,
    ptrace,
    read_registers,
    resume_interrupted_wait,
)

HOLD_SPAN = 16  # a thread stopped at a probe stands past the instruction probed: one is at most 15 bytes


def at_hold(regs: tuple[int, ...], holds: frozenset[int]) -> bool:
    """Whether a thread stands at one of the holds (the addresses of probes that stopped it at
    a function's entry, such as _exit's, for a leak check at exit)."""
    return any(0 <= regs[REGS.pc] - hold < HOLD_SPAN for hold in holds)


FREEZE_TIMEOUT = 5.0  # seconds for every thread to stop (one in uninterruptible sleep may not)
READ_CHUNK = 16 << 20
COPY_SHARE = 0.8  # of the memory available, the most a copy of a target's writable memory may take


@dataclass
class FrozenImage:
    """What was copied while the process stood still."""

    pid: int
    maps: list[Mapping]
    registers: dict[int, tuple[int, ...]]  # tid -> the machine's register words (ptrace.REGS)
    memory: dict[int, mmap.mmap] = field(default_factory=dict)  # mapping start -> its bytes (zeros where unreadable)
    unreadable_pages: int = 0
    pause_seconds: float = 0.0

    def stack_scan_starts(self, holds: frozenset[int] = frozenset()) -> list[tuple[int, int]]:
        """Each thread's stack pointer, and where its stack holds live data from: its red zone
        too (the red zone's bytes below the stack pointer, which a leaf function may use), unless it
        stands in a system call or at a hold (see at_hold), where what lies below is dead,
        left by calls that have returned."""
        starts = []
        for regs in self.registers.values():
            # Where the registers do not name the call (aarch64), there is no red zone to leave out.
            dead = call_at_stop(regs, None) is not None or at_hold(regs, holds)
            starts.append((regs[REGS.sp], regs[REGS.sp] - (0 if dead else HOST.red_zone)))
        return starts

    def root_registers(self, holds: frozenset[int] = frozenset()) -> list[int]:
        """The register values that may point to live data: every register of a thread, but of
        one at a hold only those its call keeps (the callee-saved ones, its argument, the stack
        and thread pointers): the others hold what earlier calls left."""
        return [
            value
            for regs in self.registers.values()
            for index, value in enumerate(regs)
            if not at_hold(regs, holds) or index in REGS.kept_by_call
        ]

    def read(self, address: int, size: int) -> bytes:
        """Bytes of the copy at address, across mappings that adjoin (a library's .data and its
        .bss); fewer where the copy ends, none outside it."""
        found = b""
        while size > 0:
            chunk = next(
                (
                    data[address - start : address - start + size]
                    for start, data in self.memory.items()
                    if start <= address < start + len(data)
                ),
                b"",
            )
            if not chunk:
                break
            found, address, size = found + chunk, address + len(chunk), size - len(chunk)
        return found


def _threads(pid: int) -> set[int]:
    try:
        return {int(tid) for tid in os.listdir(f"/proc/{pid}/task")}
    except FileNotFoundError:
        return set()


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.process_vm_readv.restype = ctypes.c_ssize_t
_libc.process_vm_readv.argtypes = [
    ctypes.c_int,
    ctypes.POINTER(_IoVec),
    ctypes.c_ulong,
    ctypes.POINTER(_IoVec),
    ctypes.c_ulong,
    ctypes.c_ulong,
]


def _read_memory(pid: int, mem_fd: int, into: memoryview, address: int) -> int:
    """Bytes of pid's memory at address read into `into` (up to the first unreadable page):
    process_vm_readv (a third faster than /proc/PID/mem here: 0.25 s against 0.40 s per GiB),
    /proc/PID/mem where it reads nothing."""
    local = _IoVec(ctypes.addressof(ctypes.c_char.from_buffer(into)), len(into))
    remote = _IoVec(address, len(into))
    done = _libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if done > 0:
        return int(done)
    if ctypes.get_errno() == errno.ESRCH:  # its address space is gone: not one page more to try
        raise RuntimeFailure(f"pid {pid} exited while it was being copied")
    try:
        return os.preadv(mem_fd, [into], address)
    except OSError:
        return 0


def _read_into(pid: int, mem_fd: int, buffer: mmap.mmap, address: int, page: int) -> int:
    """Fills buffer with the memory at address; unreadable pages stay zero. Returns how many there were."""
    view, skipped, offset = memoryview(buffer), 0, 0
    while offset < len(buffer):
        done = _read_memory(pid, mem_fd, view[offset : offset + READ_CHUNK], address + offset)
        if done <= 0:  # a page that cannot be read: skip it
            skipped += 1
            done = min(page, len(buffer) - offset)
        offset += done
    return skipped


def _buffer(size: int) -> mmap.mmap:
    """Zeroed memory with its pages already in place (MAP_POPULATE)."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)


def _available_memory() -> int:
    """Bytes this machine can still give (MemAvailable)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def _buffers(pid: int, wanted: Callable[[Mapping], bool]) -> dict[tuple[int, int], mmap.mmap]:
    """Buffers for the wanted mappings, made before the freeze: filling fresh pages would
    fault each one in while the process stands still (3 s per GiB here, against 0.25 s).
    The target sizes them: more than COPY_SHARE of the memory available is refused."""
    try:
        with open(proc_path(pid, "maps")) as f:
            mappings = [m for m in parse_maps(f.read()) if wanted(m)]
    except OSError:
        return {}
    total, available = sum(m.end - m.start for m in mappings), _available_memory()
    if total > available * COPY_SHARE:
        raise RuntimeFailure(
            f"pid {pid} has {total / (1 << 30):.1f} GiB of writable memory to copy, more than "
            f"this machine can spare ({available / (1 << 30):.1f} GiB available)"
        )
    return {(m.start, m.end): _buffer(m.end - m.start) for m in mappings}


@dataclass
class FrozenProcess:
    """A process whose threads all stand still, for as long as frozen() lasts."""

    pid: int
    maps_text: str
    registers: dict[int, tuple[int, ...]]
    mem_fd: int

    @property
    def maps(self) -> list[Mapping]:
        return parse_maps(self.maps_text)

    def read(self, address: int, size: int) -> bytes:
        """Bytes of the process at address (none where it cannot be read)."""
        try:
            return os.pread(self.mem_fd, size, address)
        except OSError:
            return b""


def _seize_every_thread(pid: int) -> set[int]:
    """PTRACE_SEIZE + PTRACE_INTERRUPT on every thread; threads may start while others are
    being stopped, so the list is read again until none is new. A process whose threads all
    came and went meanwhile (each replaced by a new one) is tried again while it lives."""
    for _ in range(100):
        seized = _seize_threads_once(pid)
        if seized or not alive(pid):
            return seized
        time.sleep(0.001)
    return seized


def _seize_threads_once(pid: int) -> set[int]:
    seized: set[int] = set()
    tried: set[int] = set()
    while True:
        new = _threads(pid) - tried
        if not new:
            return seized
        for tid in new:
            tried.add(tid)
            try:
                ptrace(PTRACE_SEIZE, tid)
                _calls_before[tid] = call_before_interrupt(pid, tid)
                ptrace(PTRACE_INTERRUPT, tid)
                seized.add(tid)
            except OSError as e:
                # ESRCH: gone; EPERM: exiting, or (the first thread) a zombie that called
                # pthread_exit and waits for the others.
                if e.errno == errno.ESRCH or (e.errno == errno.EPERM and (tid != pid or zombie(pid))):
                    continue
                _release(pid, seized)
                raise RuntimeFailure(_why_not_stopped(pid, e)) from None


def _tracer_of(pid: int) -> int:
    return int(status_field(pid, "TracerPid") or "0")


def _why_not_stopped(pid: int, error: OSError) -> str:
    """Why PTRACE_SEIZE of a process's first thread failed: it is exiting (a dying process
    refuses with EPERM until it is a zombie), another tracer has it, or what the kernel said."""
    if error.errno == errno.EPERM:
        tracer = _tracer_of(pid)
        if tracer:
            return f"cannot stop pid {pid}: pid {tracer} traces it (a debugger?)"
        deadline = time.monotonic() + 0.1
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.005)
    if not alive(pid):
        return f"pid {pid} has exited"
    return f"cannot stop pid {pid}: {error.strerror}"


RELEASE_TIMEOUT = 2.0  # seconds for a seized thread to reach a stop it can be detached from, or exit
# Threads seized by a freeze that could not be let go in time (a thread in uninterruptible
# sleep): tid -> the process; every later freeze, and the end of the trace, tries them again.
_unreleased: dict[int, int] = {}
# The call each seized thread slept in before its interrupt (ptrace.call_before_interrupt), until it is let go.
_calls_before: dict[int, BlockedCall | None] = {}


def _detach(tid: int, signal_number: int = 0) -> bool:
    """PTRACE_DETACH, passing on a signal the thread was stopped to be given; False while the
    thread is not in a ptrace stop (ESRCH), True once it is released or gone."""
    if not signal_number:
        resume_interrupted_wait(tid, _calls_before.get(tid))
    try:
        ptrace(PTRACE_DETACH, tid, None, signal_number)
    except OSError as e:
        if e.errno == errno.ESRCH:
            return False
    _calls_before.pop(tid, None)
    return True


def _release(pid: int, seized: set[int], pending_signals: dict[int, int] | None = None) -> None:
    """Lets every seized thread go: each is detached in a ptrace stop (one not yet stopped is
    interrupted and waited for; a signal it was stopped for is handed on), or reaped when it
    exited meanwhile (waited for with __WALL, so no zombie stays attached to leaktrace). The
    first thread of our own child is not reaped here: its parent's wait takes its status."""
    pending_signals = pending_signals or {}
    waiting = {tid for tid in seized if not _detach(tid, pending_signals.get(tid, 0))}
    for tid in waiting:
        with contextlib.suppress(OSError):
            ptrace(PTRACE_INTERRUPT, tid)
    for tid, status in _reports(pid, waiting, RELEASE_TIMEOUT):
        if not os.WIFSTOPPED(status) or _detach(tid, _signal_of_stop(status)):
            waiting.discard(tid)  # released, or it exited and is reaped
    _unreleased.update(dict.fromkeys(waiting, pid))


def _reports(pid: int, waiting: set[int], timeout: float) -> Iterator[tuple[int, int]]:
    """(tid, wait status) of each thread of waiting that reports a stop or its exit, polled
    until waiting is empty or timeout has passed (the caller takes out those it is done with);
    a thread that is no longer ours, and the first thread of our own child once it has died
    (left unreaped for its parent's wait), are taken out here."""
    our_child = parent_of(pid) == os.getpid()
    deadline = time.monotonic() + timeout
    while waiting:
        for tid in list(waiting):
            if tid == pid and (zombie(pid) or our_child and _leader_exited(pid)):
                waiting.discard(tid)  # it died: its status is its parent's (or comes when its threads are gone)
                continue
            try:
                done, status = os.waitpid(tid, os.WNOHANG | WALL)
            except ChildProcessError:  # neither traced by us nor ours any more
                waiting.discard(tid)
                continue
            if done:
                yield tid, status
        if waiting:
            if time.monotonic() > deadline:
                return
            time.sleep(0.0005)


def _signal_of_stop(status: int) -> int:
    """The signal a ptrace stop holds back, to be handed on when the thread is let go (0 for
    the interrupt's own stop, a group stop, or an event)."""
    signal_number = os.WSTOPSIG(status)
    if status >> 16 or signal_number == 5:  # an event stop (PTRACE_INTERRUPT's), or SIGTRAP
        return 0
    return signal_number


def release_leftovers() -> None:
    """Tries again to let go the threads an earlier freeze could not release in time."""
    by_process: dict[int, set[int]] = {}
    for tid, pid in _unreleased.items():
        by_process.setdefault(pid, set()).add(tid)
    _unreleased.clear()
    for pid, tids in by_process.items():
        _release(pid, tids)


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[FrozenProcess]:
    """Every thread of pid stopped, its registers and maps read, until the block ends;
    raises RuntimeFailure if the process cannot be stopped or is gone."""
    release_leftovers()
    seized = _seize_every_thread(pid)
    held_signals: dict[int, int] = {}
    try:
        if not seized:
            raise RuntimeFailure(f"pid {pid} has exited")
        registers = _wait_and_read_registers(pid, seized, held_signals)
        try:
            with open(proc_path(pid, "maps")) as f:
                maps_text = f.read()
            mem_fd = os.open(proc_path(pid, "mem"), os.O_RDONLY)
        except PermissionError as e:
            raise RuntimeFailure(
                f"cannot read pid {pid}'s memory: {e.strerror} (another user's process needs CAP_SYS_PTRACE "
                "and CAP_DAC_READ_SEARCH)"
            ) from None
        except OSError:
            raise RuntimeFailure(f"pid {pid} exited while it was stopped") from None
        try:
            yield FrozenProcess(pid, maps_text, registers, mem_fd)
        finally:
            os.close(mem_fd)
    finally:
        _release(pid, seized, held_signals)


def freeze_and_copy(pid: int, wanted: Callable[[Mapping], bool]) -> FrozenImage:
    """Stops every thread of pid, copies its registers, its maps and the mappings for which
    wanted(mapping) is true, and lets it go; raises RuntimeFailure if it cannot."""
    buffers = _buffers(pid, wanted)
    # Mappings made since the buffers were: room for them as far as the buffers left it.
    room = _available_memory() * COPY_SHARE - sum(len(buffer) for buffer in buffers.values())
    started = time.monotonic()
    with frozen(pid) as process:
        image = FrozenImage(pid, process.maps, process.registers)
        page = os.sysconf("SC_PAGE_SIZE")
        reader = live_thread(pid) or pid  # a thread whose address space is readable, picked once per copy
        for mapping in image.maps:
            if wanted(mapping):
                buffer = buffers.pop((mapping.start, mapping.end), None)
                if buffer is None:
                    room -= mapping.end - mapping.start
                    if room < 0:
                        raise RuntimeFailure(
                            f"pid {pid} mapped more writable memory while being stopped than "
                            "this machine can spare for the copy"
                        )
                    buffer = _buffer(mapping.end - mapping.start)
                image.unreadable_pages += _read_into(reader, process.mem_fd, buffer, mapping.start, page)
                image.memory[mapping.start] = buffer
    image.pause_seconds = time.monotonic() - started
    return image


def _leader_exited(pid: int) -> bool:
    """Our child's first thread has a death to report: left unreaped here, for the wait
    that collects its exit status. (A tracer that is not the parent must reap it instead,
    or the real parent would not hear of it.)"""
    try:
        found = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT | WALL)
    except ChildProcessError:
        return False
    # A tracer hears of ptrace stops whatever the flags: only a death counts here.
    return found is not None and found.si_code in (os.CLD_EXITED, os.CLD_KILLED, os.CLD_DUMPED)


def _wait_and_read_registers(pid: int, seized: set[int], held_signals: dict[int, int]) -> dict[int, tuple[int, ...]]:
    """Waits until each seized thread is in a ptrace stop (its interrupt's, or one for a signal
    that came first: kept in held_signals, to be handed on); threads that exit instead are left out."""
    registers: dict[int, tuple[int, ...]] = {}
    waiting = set(seized)
    for tid, status in _reports(pid, waiting, FREEZE_TIMEOUT):
        waiting.discard(tid)
        if os.WIFSTOPPED(status):
            if _signal_of_stop(status):
                held_signals[tid] = _signal_of_stop(status)
            try:
                registers[tid] = tuple(read_registers(tid))
            except OSError:
                pass
    if waiting:
        raise RuntimeFailure(f"{len(waiting)} thread(s) did not stop within {FREEZE_TIMEOUT:g} s")
    return registers
