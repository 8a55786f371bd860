"""Facts about target processes: maps, names, and which allocator library they use."""

from __future__ import annotations

import functools
import itertools
import os
import re
import resource
import shutil
import signal
import subprocess
from dataclasses import dataclass

from leaktrace.errors import RuntimeFailure
from leaktrace.model.snapshot import ProcessInfo
from leaktrace.platform import system
from leaktrace.platform.arch import HOST
from leaktrace.platform.containers import container_of
from leaktrace.platform.elf import ElfError, ElfFile
from leaktrace.platform.target_files import credentials_of


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    perms: str
    offset: int
    inode: int
    path: str
    device: str = ""  # major:minor, hexadecimal, as maps prints it (maps_device)


def maps_device(st_dev: int) -> str:
    """A stat's device as /proc/PID/maps prints it: major:minor in hexadecimal."""
    return f"{os.major(st_dev):02x}:{os.minor(st_dev):02x}"


@functools.lru_cache(maxsize=8)
def mapped_identity(path: str) -> tuple[str, int]:
    """The (device, inode) that /proc/PID/maps shows for a mapping of path: stat's, but on
    overlayfs (a container's root, a test VM's), whose mappings show the file of the layer
    beneath. Found by mapping its first page here for a moment and reading our own maps."""
    import ctypes  # a library's identity is asked for rarely: no import at start-up

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype, libc.mmap.argtypes = (
        ctypes.c_void_p,
        [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3 + [ctypes.c_long],
    )
    st = os.stat(path)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        address = libc.mmap(None, page, 1, 2, fd, 0)  # PROT_READ, MAP_PRIVATE
        if address in (None, ctypes.c_void_p(-1).value):
            return maps_device(st.st_dev), st.st_ino
        try:
            with open("/proc/self/maps") as maps:
                mine = next((m for m in map(_mapping, maps) if m and m.start == address), None)
        finally:
            libc.munmap(ctypes.c_void_p(address), ctypes.c_size_t(page))
    finally:
        os.close(fd)
    return (mine.device, mine.inode) if mine else (maps_device(st.st_dev), st.st_ino)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """A target's name (comm, file name, symbol) with its control characters as \\xNN: it may
    carry terminal escape sequences, and reports reach root's terminal."""
    if text.isascii() and text.isprintable():
        return text
    return _CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


@functools.lru_cache(maxsize=1 << 16)
def _mapping(line: str) -> Mapping | None:
    """A line of /proc/PID/maps (lines repeat from read to read: each is parsed once)."""
    parts = line.split(maxsplit=5)
    if len(parts) < 5:
        return None
    start, end = (int(x, 16) for x in parts[0].split("-"))
    path = parts[5] if len(parts) > 5 else ""
    return Mapping(start, end, parts[1], int(parts[2], 16), int(parts[4]), path, parts[3])


def parse_maps(text: str) -> list[Mapping]:
    return [m for m in map(_mapping, text.splitlines()) if m]


_VERSIONS = itertools.count(1)


class MapsFollower:
    """One process's executable mappings from one read of its maps to the next: each read parses
    only the lines that changed (a command with a thousand modules rereads them all per dlopen)."""

    def __init__(self) -> None:
        self._lines: frozenset[str] = frozenset()
        self._executable: dict[str, Mapping] = {}  # maps line -> its mapping
        self._unmapped: dict[str, Mapping] = {}  # file mappings gone, whose range nothing maps now
        self.executable: list[Mapping] = []  # by address
        self.version = 0  # unique among followers; changes with the executable mappings

    def follow(self, text: str) -> None:
        """Takes the maps now."""
        lines = frozenset(text.splitlines())
        added, removed = lines - self._lines, self._lines - lines
        if not added and not removed:
            return
        if self._executable and not self._executable.keys() & lines:  # another image (exec)
            self._executable, self._unmapped = {}, {}
        self._lines = lines
        gone = removed & self._executable.keys()
        for line in gone:
            if self._executable[line].path.startswith("/"):
                self._unmapped[line] = self._executable[line]
            del self._executable[line]
        executable = [line for line in added if line[line.find(" ") + 3 : line.find(" ") + 4] == "x"]
        new = {line: m for line, m in zip(executable, map(_mapping, executable)) if m and m.path != "[vsyscall]"}
        self._executable.update(new)
        if self._unmapped and added:
            mapped = parse_maps(text)
            self._unmapped = {
                line: m
                for line, m in self._unmapped.items()
                if not any(n.start < m.end and m.start < n.end for n in mapped)
            }
        if gone or new:
            self.executable = sorted(self._executable.values(), key=lambda m: m.start)
            self.version = next(_VERSIONS)

    @property
    def unmapped(self) -> str:
        """The executable file mappings gone from the maps (a dlclose'd library) whose range no
        mapping covers now, in maps' form."""
        return "\n".join(self._unmapped)


def _read_address_space_file(pid: int, name: str, tries: int = 200) -> bytes:
    """/proc's maps or cmdline of a process, read through its first thread or, when that one
    has exited (pthread_exit), through any other: each thread's file reads empty once it is a
    zombie, and threads may come and go between the listing and the read."""
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            data = f.read()
        if data:
            return data  # the common case: its first thread lives
    except (FileNotFoundError, ProcessLookupError):
        pass
    for _ in range(tries):
        try:
            threads = [pid] + [int(tid) for tid in os.listdir(f"/proc/{pid}/task") if int(tid) != pid]
        except (FileNotFoundError, ProcessLookupError):
            break
        for tid in threads:
            path = f"/proc/{pid}/{name}" if tid == pid else f"/proc/{pid}/task/{tid}/{name}"
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if data or tid == pid and not zombie(pid):
                return data
        if live_thread(pid) is None:
            break
    with open(f"/proc/{pid}/{name}", "rb") as f:  # gone, or every thread a zombie: what its first has
        return f.read()


COMMAND_LINE_LIMIT = 4096  # characters of a command line kept


def command_line(pid: int) -> str:
    """A process's arguments, joined by spaces, printable and bounded ("" when gone)."""
    try:
        arguments = _read_address_space_file(pid, "cmdline").rstrip(b"\0").split(b"\0")
    except OSError:
        return ""
    return printable(" ".join(a.decode(errors="replace") for a in arguments))[:COMMAND_LINE_LIMIT]


VALGRIND_TOOL = re.compile(r"^[a-z]+-amd64-")  # valgrind's tool process, as comm cuts it: memcheck-amd64-


def valgrind_guests() -> list[int]:
    """The processes running under valgrind now (its tool's process is the program's)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/comm") as f:
                comm = f.read(64)
        except OSError:
            continue
        if VALGRIND_TOOL.match(comm):
            found.append(int(name))
    return sorted(found)


def read_process(pid: int) -> ProcessInfo | None:
    """Reads a process's name and maps; None when it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
        argv0 = _read_address_space_file(pid, "cmdline").split(b"\0", 1)[0].decode(errors="replace")
        maps = _read_address_space_file(pid, "maps").decode(errors="replace")
        credentials = credentials_of(pid)
    except (FileNotFoundError, ProcessLookupError):
        return None
    except RuntimeFailure:  # its status went between two reads
        return None
    except PermissionError as e:
        raise RuntimeFailure(f"cannot read pid {pid}: {e.strerror}") from None
    name = printable(os.path.basename(argv0) or comm)
    return ProcessInfo(pid, printable(comm), name, maps, credentials=credentials, container=container_of(pid))


def _stat_fields(pid: int | str) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state first); none if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return []


def process_state(pid: int) -> str | None:
    """The state letter of /proc/PID/stat (T: stopped by a signal); None once it is gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def on_terminal(pid: int) -> bool:
    """The process has a controlling terminal (tty_nr of /proc/PID/stat); False once it is gone."""
    fields = _stat_fields(pid)
    return len(fields) > 4 and fields[4] != "0"


def alive(pid: int) -> bool:
    """The process lives: any of its threads does (its first thread may have called
    pthread_exit and wait, a zombie, for the others)."""
    return live_thread(pid) is not None


def status_field(pid: int | str, name: str) -> str | None:
    """A field of /proc/PID/status (the kernel's words), None if the process or field is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(f"{name}:")), None)
    except OSError:
        return None


def catches(pid: int, signal_number: int) -> bool:
    """The process has a handler for the signal (the kernel's SigCgt mask, not the process's word)."""
    mask = int(status_field(pid, "SigCgt") or "0", 16)
    return bool(mask >> (signal_number - 1) & 1)


def zombie(tid: int) -> bool:
    """The thread (a process's first) has exited: its own state is Z or X, or it is gone."""
    fields = _stat_fields(tid)
    return not fields or fields[0] in ("Z", "X")


THREAD_LISTINGS = 16  # reads of a process's threads while they come and go, before it counts as gone


def live_thread(pid: int) -> int | None:
    """A thread of the process that is not a zombie (pid itself if it is one), through which
    its memory and maps can be read; None once every thread has exited."""
    fields = _stat_fields(pid)
    if not fields:
        return None
    if fields[0] not in ("Z", "X"):
        return pid
    # Threads that end while they are read may have started others meanwhile: the listing is
    # read again until a live one is found, or none but the first is left.
    for _ in range(THREAD_LISTINGS):
        try:
            threads = sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task"))
        except (FileNotFoundError, ProcessLookupError):
            return None
        for tid in threads:
            thread = _stat_fields(f"{pid}/task/{tid}")
            if thread and thread[0] not in ("Z", "X"):
                return tid
        if threads == [pid]:
            return None
    return None


SYSCALL_THREADS_READ = 4096  # threads of a process whose system call is read, at the most


def waits_in_read(pid: int, fd: int) -> bool:
    """A thread of the process is blocked in read(fd) now (the kernel's /proc/PID/task/TID/syscall,
    never the process's word)."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")[:SYSCALL_THREADS_READ]
    except OSError:
        return False
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/syscall", "rb") as f:
                words = f.read(256).split()
        except OSError:
            continue
        if len(words) > 1 and words[0] == str(HOST.syscalls["read"]).encode() and words[1] == f"{fd:#x}".encode():
            return True
    return False


def proc_path(pid: int, name: str) -> str:
    """/proc's file of the process's address space (maps, mem) through a live thread of it."""
    tid = live_thread(pid)
    return f"/proc/{pid}/{name}" if tid in (pid, None) else f"/proc/{pid}/task/{tid}/{name}"


def parent_of(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def _thread_group_of(pid: int) -> int | None:
    """The process a thread id belongs to (itself for a process); None if it is gone."""
    tgid = status_field(pid, "Tgid")
    return int(tgid) if tgid else None


def read_target(pid: int) -> ProcessInfo:
    """The running process -p names, or one clear error: there is none, or pid is one of its threads."""
    info = read_process(pid)
    if info is None:
        raise RuntimeFailure(f"no process with pid {pid}")
    if not info.maps:  # no address space: a kernel thread, or a process that has exited
        if alive(pid):
            raise RuntimeFailure(f"pid {pid} ({info.comm}) is a kernel thread: it has no user heap to trace")
        raise RuntimeFailure(f"pid {pid} has exited (a zombie)")
    process = _thread_group_of(pid)
    if process not in (pid, None):
        raise RuntimeFailure(f"{pid} is a thread of process {process}: trace -p {process}")
    return info


def exports(path: str, symbol: str) -> bool:
    try:
        return ElfFile(path).exports_function(symbol)
    except ElfError:
        return False


def resolve_executable(name: str) -> str:
    path = name if "/" in name else shutil.which(name)
    if not path or not os.path.exists(path):
        raise RuntimeFailure(f"cannot run '{name}': No such file or directory")
    if not os.access(path, os.X_OK) or os.path.isdir(path):
        raise RuntimeFailure(f"cannot run '{name}': Permission denied")
    return os.path.realpath(path)


SCRIPT_DEPTH = 4  # interpreters of interpreters the kernel follows (BINPRM_MAX_RECURSION)


def program_behind(path: str) -> str:
    """The ELF program that running path ends up in: path itself, or for a script the
    interpreter its `#!` line names (through `env NAME`, the NAME found on PATH), followed as
    the kernel follows it. Raises RuntimeFailure when there is none."""
    for _ in range(SCRIPT_DEPTH + 1):
        try:
            with open(path, "rb") as f:
                head = f.read(256)
        except OSError as e:
            raise RuntimeFailure(f"cannot read {path}: {e.strerror}") from None
        if not head.startswith(b"#!"):
            return path
        words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
        if not words:
            raise RuntimeFailure(f"{path}: its #! line names no interpreter")
        if os.path.basename(words[0]) == "env":
            named = [word for word in words[1:] if not word.startswith("-") and "=" not in word]
            found = shutil.which(named[0]) if named else None
            path = os.path.realpath(found or words[0])
        else:
            path = os.path.realpath(words[0])
    raise RuntimeFailure(f"{path}: more than {SCRIPT_DEPTH} interpreters deep")


def program_loader(path: str) -> str | None:
    """The dynamic loader (ld.so) a program names, if it names one."""
    try:
        return ElfFile(path).interpreter
    except ElfError:
        return None


def library_of_executable(path: str, symbol: str = "malloc") -> str:
    """The library a program will bind symbol to (malloc: its allocator), asking its own loader.

    The loader's list is in symbol search order, so the first library that
    exports the symbol is the one the program's calls reach.
    """
    try:
        elf = ElfFile(path)
    except ElfError as e:
        raise RuntimeFailure(f"{path} is not an ELF program ({e}); use --lib PATH") from None
    interpreter = elf.interpreter
    if interpreter is None or elf.exports_function(symbol):  # static: all it calls is linked in
        return path
    listing = subprocess.run([interpreter, "--list", path], capture_output=True, text=True, check=False)
    for line in listing.stdout.splitlines():
        if "=>" not in line:
            continue
        library = line.split("=>", 1)[1].split("(")[0].strip()
        if library.startswith("/") and exports(library, symbol):
            return library
    raise RuntimeFailure(f"{path} loads no library exporting {symbol}; use --lib PATH")


NSIG_KERNEL = 65  # the kernel's signals are 1 to 64


def launch(
    path: str, argv: list[str], env: dict[str, str] | None = None, gate: tuple[int, int] | None = None
) -> tuple[int, int]:
    """Forks a child that execs argv (once a byte or EOF arrives on gate's read end, when
    given: the child holds no write end, so leaktrace's death lets it go) as a shell starts a
    program: every signal at its default disposition, none blocked, leaktrace's own
    RLIMIT_MEMLOCK as it was before lift_memlock. Returns its pid and
    the read end of a pipe that gives exec's error, or EOF once exec succeeded."""
    import ctypes  # for the kernel's own rt_sigaction, made ready before the fork

    syscall = ctypes.CDLL(None, use_errno=True).syscall
    default_action = ctypes.create_string_buffer(32)  # struct kernel_sigaction, all zero: SIG_DFL
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # child: nothing here may raise past os._exit
        try:
            os.close(err_r)
            if gate is not None:
                os.close(gate[1])
                os.read(gate[0], 1)
                os.close(gate[0])
            # Python ignores SIGPIPE and SIGXFSZ, and glibc refuses sigaction on its own two
            # signals, which a parent may leave ignored: an ignored signal stays so across exec.
            for sig in range(1, NSIG_KERNEL):
                syscall(HOST.syscalls["rt_sigaction"], sig, default_action, None, 8)
            signal.pthread_sigmask(signal.SIG_SETMASK, ())
            if system.memlock_before is not None:  # the limit leaktrace had before it lifted its own
                resource.setrlimit(resource.RLIMIT_MEMLOCK, system.memlock_before)
            if env is None:
                os.execv(path, argv)
            os.execve(path, argv, env)
        except OSError as e:
            os.write(err_w, os.strerror(e.errno or 0).encode())
        finally:
            os._exit(127)
    os.close(err_w)
    return pid, err_r
