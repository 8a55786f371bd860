"""Putting the library into a running process that was not started with it, and taking its
hooks out again, through one of its threads held with ptrace (platform/remote_call.py).

The process never opens the library by a path of its own: a path resolves in its mount
namespace and root, where another user may own what stands at leaktrace's path. Instead
it makes a memfd, leaktrace writes the library into it from its own side
(/proc/PID/fd/N) and seals it, and the process dlopens /proc/thread-self/fd/N, which only a
procfs at its /proc can resolve (checked first). Before any call into the library, the
mapping it loaded must be that sealed memfd (device and inode). A sealed copy loaded by an
earlier attach, with the same bytes, is used again. The calls run on a stack leaktrace
maps in the process (a thread's own may be a small coroutine stack). The library learns
that leaktrace has gone from a pipe whose only writer leaktrace holds, which works across
PID namespaces; leaktrace_detach (native/hooks.c) puts every hook back."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import stat
import struct

from leaktrace.errors import RuntimeFailure
from leaktrace.model.snapshot import ProcessInfo
from leaktrace.platform.arch import HOST
from leaktrace.platform.module_files import MUSL_NAME, ModuleFiles, runs_on_musl
from leaktrace.platform.process import (
    Mapping,
    MapsFollower,
    alive,
    maps_device,
    parse_maps,
    proc_path,
    read_target,
    status_field,
)
from leaktrace.platform.remote_call import MINUS_ONE, RemoteCaller
from leaktrace.platform.seccomp import ANY_ERRNO, PlannedCall, SeccompUnreadable, first_forbidden, read_filters
from leaktrace.sources.preload.table import (
    MEMFD_NAME,
    SEALED,
    SEALED_COPIES,
    library_base,
    library_bytes,
    library_symbols,
)
from leaktrace.sources.sampling import EXACT, Sampling

RTLD_NOW = 2
ERROR_READ_LIMIT = 512  # bytes of dlerror's message read from the target
ATTACH_ERRORS = {
    1: "the options are bad, or change how blocks are laid out (guards, expand_alloc, free_track)",
    2: "another leaktrace is attached to it",
    3: "the library could not start its watcher thread",
    4: "the library could not map its sampler's filter",
}
MFD_CLOEXEC, MFD_ALLOW_SEALING = 1, 2
F_ADD_SEALS = 1033
PROC_SUPER_MAGIC = 0x9FA0
O_CLOEXEC_IN_TARGET = 0o2000000
CALL_STACK_BYTES = 1 << 20  # the stack mapped in the target for the calls
PROT_READ, PROT_WRITE = 1, 2
MAP_PRIVATE, MAP_ANONYMOUS, MAP_NORESERVE = 0x02, 0x20, 0x4000
LIBC_FUNCTIONS = ("dlopen", "dlerror", "memfd_create", "pipe2", "close", "mmap", "munmap")


# Every system call the attach makes in the held thread (its remote calls, dlopen of the sealed
# copy, the watcher thread's start) and the library makes later in any thread, as
# platform/seccomp.py runs them through the target's filters; the addresses, descriptors and
# sizes are ones such calls pass (found by tracing an attach's system calls), filters seldom test them.
_ADDRESS, _FD, _SIZE = 0x7F0000001000, 3, 0x10000
PROT_EXEC, MAP_FIXED, MAP_DENYWRITE, MAP_STACK = 4, 0x10, 0x800, 0x20000
AT_FDCWD, AT_EMPTY_PATH, O_RDONLY_CLOEXEC = (1 << 64) - 100, 0x1000, 0o2000000
THREAD_CLONE_FLAGS = (
    0x3D0F00  # pthread_create's: VM FS FILES SIGHAND THREAD SYSVSEM SETTLS PARENT_SETTID CHILD_CLEARTID
)
# glibc's poll() and readlink() are these calls; where the machine has neither (aarch64), ppoll and readlinkat.
_POLL = (
    PlannedCall("poll", (_ADDRESS, 1, 1000))
    if "poll" in HOST.syscalls
    else PlannedCall("ppoll", (_ADDRESS, 1, _ADDRESS, 0, 8))
)
_READLINK = (
    PlannedCall("readlink", (_ADDRESS, _ADDRESS, 4095))
    if "readlink" in HOST.syscalls
    else PlannedCall("readlinkat", (AT_FDCWD, _ADDRESS, _ADDRESS, 4095))
)
ATTACH_CALLS = (
    PlannedCall(
        "mmap", (0, CALL_STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, MINUS_ONE, 0)
    ),
    PlannedCall("memfd_create", (_ADDRESS, MFD_CLOEXEC | MFD_ALLOW_SEALING)),
    PlannedCall("openat", (AT_FDCWD, _ADDRESS, O_RDONLY_CLOEXEC, 0)),
    PlannedCall("read", (_FD, _ADDRESS, 832)),
    PlannedCall("newfstatat", (_FD, _ADDRESS, _ADDRESS, AT_EMPTY_PATH)),
    PlannedCall("mmap", (0, _SIZE, PROT_READ, MAP_PRIVATE, _FD, 0)),
    PlannedCall("mmap", (0, _SIZE, PROT_READ, MAP_PRIVATE | MAP_DENYWRITE, _FD, 0)),
    *(
        PlannedCall("mmap", (_ADDRESS, _SIZE, protection, MAP_PRIVATE | MAP_FIXED | MAP_DENYWRITE, _FD, 0x1000))
        for protection in (PROT_READ, PROT_READ | PROT_EXEC, PROT_READ | PROT_WRITE)
    ),
    PlannedCall(
        "mmap", (_ADDRESS, _SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_ANONYMOUS, MINUS_ONE, 0)
    ),
    *(PlannedCall("mprotect", (_ADDRESS, _SIZE, protection)) for protection in (PROT_READ, PROT_READ | PROT_WRITE)),
    PlannedCall("munmap", (_ADDRESS, _SIZE)),
    PlannedCall("close", (_FD,)),
    PlannedCall("pipe2", (_ADDRESS, O_CLOEXEC_IN_TARGET)),
    _READLINK,
    # The watcher thread: its stack, its start (clone3, or clone where that is ENOSYS), its set-up.
    PlannedCall("mmap", (0, _SIZE, 0, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, MINUS_ONE, 0)),
    PlannedCall("rt_sigaction", (33, _ADDRESS, 0, 8)),  # glibc's SIGSETXID handler, at a process's first thread
    PlannedCall("rt_sigprocmask", (0, _ADDRESS, _ADDRESS, 8)),
    PlannedCall("rt_sigprocmask", (2, _ADDRESS, 0, 8)),
    PlannedCall(
        "clone3",
        (_ADDRESS, 88),
        fallback=PlannedCall("clone", (THREAD_CLONE_FLAGS, _ADDRESS, _ADDRESS, _ADDRESS, _ADDRESS)),
    ),
    PlannedCall("rseq", (_ADDRESS, 32, 0, 0x53053053), ANY_ERRNO),
    PlannedCall("set_robust_list", (_ADDRESS, 24), ANY_ERRNO),
    _POLL,
    PlannedCall("madvise", (_ADDRESS, _SIZE, 4), ANY_ERRNO),
    PlannedCall("exit", (0,)),
    # The library in the program's threads: memory of its own, its locks, its lines on stderr.
    PlannedCall("mmap", (0, _SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, MINUS_ONE, 0)),
    *(PlannedCall("futex", (_ADDRESS, operation, 1, 0, 0, 0)) for operation in (0x80, 0x81)),  # WAIT, WAKE private
    PlannedCall("sched_yield", (), ANY_ERRNO),
    PlannedCall("write", (2, _ADDRESS, 200)),
)


class _StatFs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_long * 15)]


_libc = ctypes.CDLL(None, use_errno=True)


def _file_system_type(fd: int) -> int:
    found = _StatFs()
    if _libc.fstatfs(fd, ctypes.byref(found)) != 0:
        raise OSError(ctypes.get_errno(), "fstatfs")
    return int(found.f_type)


def _refusal(pid: int, info: ProcessInfo, executable: list[Mapping]) -> str | None:
    """Why the library cannot be put into pid safely, or None."""
    tracer = status_field(pid, "TracerPid")
    if tracer not in (None, "0"):
        return f"pid {pid} is traced by pid {tracer} (a debugger?)"
    if (status_field(pid, "State") or "").startswith(("T", "t")):
        return f"pid {pid} is stopped (SIGSTOP or a debugger): continue it first"
    if not any(os.path.basename(m.path).startswith("ld-linux") or MUSL_NAME.search(m.path) for m in executable):
        return (
            f"pid {pid} ({info.comm}) is a static program: the in-process library cannot interpose calls "
            "inside an executable; the BPF engine (leave out --engine preload) probes its allocator by its symbols"
        )
    return None


def _refuse_filters(pid: int, tid: int) -> None:
    """RuntimeFailure naming the first call of the attach or the library that the held thread's
    seccomp filters would not allow, before any is made; the process's other threads must run
    under as many filters (they make the library's calls too, and are not read)."""
    count = status_field(f"{pid}/task/{tid}", "Seccomp_filters") or "0"
    mode = status_field(f"{pid}/task/{tid}", "Seccomp")
    if mode == "1":
        raise RuntimeFailure(f"cannot attach in-process: pid {pid} runs in seccomp's strict mode (read, write, exit)")
    if mode in (None, "0"):
        filters: list[bytes] = []
    else:
        try:
            filters = read_filters(tid)
        except SeccompUnreadable as e:
            raise RuntimeFailure(f"cannot attach in-process: pid {pid}: {e}") from None
    for other in os.listdir(f"/proc/{pid}/task"):
        if (status_field(f"{pid}/task/{other}", "Seccomp_filters") or count) != count:
            raise RuntimeFailure(
                f"cannot attach in-process: pid {pid}'s threads run under different seccomp filters "
                f"(thread {other}: {status_field(f'{pid}/task/{other}', 'Seccomp_filters')}, thread {tid}: {count})"
            )
    forbidden = first_forbidden(filters, ATTACH_CALLS)
    if forbidden:
        raise RuntimeFailure(
            f"cannot attach in-process: pid {pid}'s seccomp filter does not allow what the attach needs ({forbidden})"
        )


def _proc_is_procfs(pid: int) -> bool:
    """Whether /proc in the process's own root and mount namespace is a procfs, not a link or
    a directory someone else made (so that /proc/thread-self/fd/N there is the process's descriptor)."""
    try:
        root = os.open(proc_path(pid, "root"), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        proc = os.open("proc", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root)
        try:
            return _file_system_type(proc) == PROC_SUPER_MAGIC
        finally:
            os.close(proc)
    except OSError:
        return False
    finally:
        os.close(root)


class Injection:
    """The library loaded into pid and its hooks in place, until detach()."""

    def __init__(self, pid: int, options: str, sampling: Sampling = EXACT):
        self._watch_end: int | None = None  # the pipe's write end: the library's sign that leaktrace lives
        try:
            self._put_in(pid, options, sampling)
        except OSError as e:  # the process (or the thread held) went, or the kernel refused a step
            self._close_watch_end()
            if not alive(pid):
                raise RuntimeFailure(f"pid {pid} exited while leaktrace's library was being put in") from None
            raise RuntimeFailure(f"cannot attach in-process to pid {pid}: {e.strerror or e}") from None
        except RuntimeFailure:
            self._close_watch_end()
            raise

    def _put_in(self, pid: int, options: str, sampling: Sampling) -> None:
        info = read_target(pid)
        maps = MapsFollower()
        maps.follow(info.maps)
        refused = _refusal(pid, info, maps.executable)
        if refused:
            raise RuntimeFailure(f"cannot attach in-process: {refused}")
        self.pid = pid
        self._on_musl = runs_on_musl(maps.executable)
        library_bytes(self._on_musl)  # built for its libc, or refused before it is touched
        self._forbidden, functions = self._survey(info, maps.executable)
        missing = [name for name in LIBC_FUNCTIONS if name not in functions]
        if missing:
            needed = "musl 1.1.20" if self._on_musl else "glibc 2.34"
            raise RuntimeFailure(
                f"cannot attach in-process: pid {pid}'s libc lacks {', '.join(missing)} ({needed} or later)"
            )
        caller = RemoteCaller(pid, self._forbidden)
        try:
            _refuse_filters(pid, caller.tid)
        except RuntimeFailure:
            caller.release()
            raise
        stack = 0
        try:
            stack, _ = caller.call(
                functions["mmap"],
                [
                    0,
                    CALL_STACK_BYTES,
                    PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                    MINUS_ONE,
                    0,
                ],
            )
            if stack >= MINUS_ONE - 4095:
                raise RuntimeFailure(f"cannot attach in-process: pid {pid} could not map a stack for the calls")
            caller.stack_top = stack + CALL_STACK_BYTES
            base = library_base(pid, parse_maps(read_target(pid).maps))
            if base is None:
                base = self._load_sealed_copy(caller, functions)
            watch = self._watch_pipe(caller, functions)
            attach = base + library_symbols(self._on_musl)["leaktrace_attach"]
            result, _ = caller.call(attach, [-1, watch, sampling.rate, sampling.seed], options.encode() + b"\0")
        finally:
            if stack and stack < MINUS_ONE - 4095:
                with contextlib.suppress(OSError, RuntimeFailure):
                    caller.stack_top = None
                    caller.call(functions["munmap"], [stack, CALL_STACK_BYTES])
            caller.release()
        if result:
            raise RuntimeFailure(f"cannot attach in-process to pid {pid}: {ATTACH_ERRORS.get(result, result)}")

    def _load_sealed_copy(self, caller: RemoteCaller, functions: dict[str, int]) -> int:
        """The library's base in the process once it has loaded a sealed memfd copy of it."""
        pid = self.pid
        fd, _ = caller.call(functions["memfd_create"], [-1, MFD_CLOEXEC | MFD_ALLOW_SEALING], MEMFD_NAME + b"\0")
        if fd >= 1 << 31:
            raise RuntimeFailure(f"cannot attach in-process: pid {pid} could not make a memfd")
        try:
            identity = self._fill_and_seal(fd)
            if not _proc_is_procfs(pid):
                raise RuntimeFailure(
                    f"cannot attach in-process: /proc in pid {pid}'s mount namespace is not a procfs, "
                    "so the library cannot be loaded by its descriptor"
                )
            handle, _ = caller.call(functions["dlopen"], [-1, RTLD_NOW], f"/proc/thread-self/fd/{fd}".encode() + b"\0")
            if not handle:
                message, _ = caller.call(functions["dlerror"], [])
                why = self._read_string(caller, message) if message else "no reason given"
                raise RuntimeFailure(f"cannot attach in-process: pid {pid} could not load leaktrace's library: {why}")
        finally:
            with contextlib.suppress(OSError, RuntimeFailure):
                caller.call(functions["close"], [fd])
        device = maps_device(identity[0])
        for mapping in parse_maps(read_target(pid).maps):
            if mapping.offset == 0 and (mapping.device, mapping.inode) == (device, identity[1]):
                SEALED_COPIES.add((device, identity[1], self._on_musl))
                return mapping.start
        raise RuntimeFailure(
            f"cannot attach in-process: what pid {pid} loaded is not leaktrace's sealed copy; nothing was called in it"
        )

    def _fill_and_seal(self, fd_in_target: int) -> tuple[int, int]:
        """Writes the library into the process's new memfd from leaktrace's side and seals it:
        its (device, inode). Refused if the descriptor is not an empty memfd that can be sealed."""
        try:
            fd = os.open(proc_path(self.pid, f"fd/{fd_in_target}"), os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            raise RuntimeFailure(
                f"cannot attach in-process: cannot open pid {self.pid}'s memfd: {e.strerror}"
            ) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size != 0 or st.st_nlink != 0:
                raise RuntimeFailure(f"cannot attach in-process: pid {self.pid}'s descriptor is not a new memfd")
            library = library_bytes(self._on_musl)
            written = 0
            while written < len(library):
                written += os.pwrite(fd, library[written : written + (1 << 20)], written)
            fcntl.fcntl(fd, F_ADD_SEALS, SEALED)
            if os.fstat(fd).st_size != len(library) or os.pread(fd, len(library) + 1, 0) != library:
                raise RuntimeFailure(f"cannot attach in-process: pid {self.pid}'s memfd changed while it was written")
            return st.st_dev, st.st_ino
        except OSError as e:
            raise RuntimeFailure(
                f"cannot attach in-process: cannot seal leaktrace's library in pid {self.pid}: {e.strerror}"
            ) from None
        finally:
            os.close(fd)

    def _watch_pipe(self, caller: RemoteCaller, functions: dict[str, int]) -> int:
        """A pipe whose read end the process keeps (handed to the library) and whose only write
        end leaktrace holds: the read end sees a hang-up when leaktrace ends, however it ends."""
        failed, ends = caller.call(functions["pipe2"], [-1, O_CLOEXEC_IN_TARGET], b"\0" * 8)
        if failed:
            raise RuntimeFailure(f"cannot attach in-process: pid {self.pid} could not make a pipe")
        read_end, write_end = struct.unpack("<ii", caller.read(ends, 8, exact=True))
        try:
            self._watch_end = os.open(proc_path(self.pid, f"fd/{write_end}"), os.O_WRONLY | os.O_CLOEXEC)
            if not stat.S_ISFIFO(os.fstat(self._watch_end).st_mode):
                raise OSError(errno.EINVAL, "not a pipe")
        except OSError as e:
            with contextlib.suppress(OSError, RuntimeFailure):
                caller.call(functions["close"], [read_end])
            raise RuntimeFailure(f"cannot attach in-process: cannot hold pid {self.pid}'s pipe: {e.strerror}") from None
        finally:
            with contextlib.suppress(OSError, RuntimeFailure):
                caller.call(functions["close"], [write_end])
        return read_end

    def _close_watch_end(self) -> None:
        if self._watch_end is not None:
            os.close(self._watch_end)
            self._watch_end = None

    @staticmethod
    def _survey(info: ProcessInfo, executable: list[Mapping]) -> tuple[list[tuple[int, int]], dict[str, int]]:
        """The code no held thread may be in (the loader, libc, any allocator, this library and
        its unwinder), and the libc functions the attach calls in the process."""
        forbidden, functions = [], {}
        files = ModuleFiles().open(info, executable)
        for m in executable:
            elf, name = files.get(m.start), os.path.basename(m.path)
            allocator = elf is not None and elf.exports_function("malloc")  # this library exports it too
            if allocator or name.startswith(("ld-linux", "libgcc_s")):
                forbidden.append((m.start, m.end))
            vaddr = elf.file_offset_to_vaddr(m.offset) if elf is not None else None
            if elf is not None and vaddr is not None and (name.startswith("libc.so") or MUSL_NAME.search(m.path)):
                exported = elf.dynamic_functions
                for function in LIBC_FUNCTIONS:
                    if function in exported:
                        functions[function] = m.start - vaddr + exported[function]
        return forbidden, functions

    @staticmethod
    def _read_string(caller: RemoteCaller, address: int) -> str:
        try:
            text = caller.read(address, ERROR_READ_LIMIT)
        except (OSError, RuntimeFailure):
            return "its message could not be read"
        return text.split(b"\0", 1)[0].decode(errors="replace")

    def detach(self) -> None:
        """Every hook back; the library stays loaded, idle. Nothing to do once the process is gone."""
        try:
            try:
                caller = RemoteCaller(self.pid, self._forbidden)
            except (RuntimeFailure, OSError):
                return  # gone; or never calm: its watcher puts the hooks back when the pipe hangs up
            try:
                base = library_base(self.pid, parse_maps(read_target(self.pid).maps))
                if base is not None:
                    caller.call(base + library_symbols(self._on_musl)["leaktrace_detach"], [])
            except (RuntimeFailure, OSError):
                pass  # gone meanwhile; or its watcher puts the hooks back when the pipe hangs up
            finally:
                caller.release()
        finally:
            self._close_watch_end()
