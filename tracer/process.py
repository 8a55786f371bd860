"""Facts about target processes: maps, names, and which allocator library they use."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from .elf import ElfError, ElfFile
from .errors import RuntimeFailure
from .snapshot import ProcessInfo

@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    perms: str
    offset: int
    inode: int
    path: str


def parse_maps(text: str) -> list[Mapping]:
    result = []
    for line in text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 5:
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        path = parts[5] if len(parts) > 5 else ""
        result.append(Mapping(start, end, parts[1], int(parts[2], 16), int(parts[4]), path))
    return result


def read_process(pid: int) -> ProcessInfo | None:
    """Reads a process's name and maps; None when it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0", 1)[0].decode(errors="replace")
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except PermissionError as e:
        raise RuntimeFailure(f"cannot read pid {pid}: {e.strerror}") from None
    return ProcessInfo(pid, comm, os.path.basename(argv0) or comm, maps)


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state first); none if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return []


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


def parent_of(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def _thread_group_of(pid: int) -> int | None:
    """The process a thread id belongs to (itself for a process); None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return None


def read_target(pid: int) -> ProcessInfo:
    """The running process -p names, or one clear error: there is none, or pid is one of its threads."""
    info = read_process(pid)
    if info is None:
        raise RuntimeFailure(f"no process with pid {pid}")
    if not info.maps:   # no address space: a kernel thread, or a process that has exited
        if alive(pid):
            raise RuntimeFailure(f"pid {pid} ({info.comm}) is a kernel thread: it has no user heap to trace")
        raise RuntimeFailure(f"pid {pid} has exited (a zombie)")
    process = _thread_group_of(pid)
    if process not in (pid, None):
        raise RuntimeFailure(f"{pid} is a thread of process {process}: trace -p {process}")
    return info


def host_path(pid: int, path: str) -> str:
    """A path seen by the target, as this process can open it (containers have their own root)."""
    rooted = f"/proc/{pid}/root{path}"
    try:
        return path if os.path.samefile(rooted, path) else rooted
    except OSError:
        return rooted if os.path.exists(rooted) else path


def exports(path: str, symbol: str) -> bool:
    try:
        return ElfFile(path).exports_function(symbol)
    except ElfError:
        return False


def allocator_library_of_process(pid: int, maps: str) -> str:
    """The allocator library a running process uses, from its maps.

    A library other than libc that exports malloc (jemalloc, tcmalloc, mimalloc)
    is preferred: when one is mapped it is almost always the one in use.
    """
    libraries: list[str] = []
    for mapping in parse_maps(maps):
        if mapping.path.startswith("/") and mapping.path not in libraries and ".so" in mapping.path:
            libraries.append(mapping.path)
    candidates = [p for p in libraries if "/ld-" not in p and exports(host_path(pid, p), "malloc")]
    if not candidates:
        raise RuntimeFailure(f"pid {pid} maps no dynamic allocator library (statically linked?); "
                             "use --lib PATH")
    others = [p for p in candidates if "/libc.so" not in p and "/libc-" not in p]
    return host_path(pid, (others or candidates)[0])


_LIBC_NAME = re.compile(r"/(libc\.so[.\d]*|libc-[\d.]+\.so|ld-musl-[^/]*\.so[.\d]*)$")


def libc_libraries() -> tuple[str, ...]:
    """Every distinct libc mapped by a running process (a container's is another file), each
    as a path this process can open; this process's own libc first."""
    found: dict[tuple[int, int], str] = {}
    pids = [os.getpid()] + sorted(int(name) for name in os.listdir("/proc") if name.isdigit())
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                paths = {m.path for m in parse_maps(f.read()) if _LIBC_NAME.search(m.path)}
        except OSError:
            continue   # gone, or a kernel thread
        for path in sorted(paths):
            opened = host_path(pid, path)
            try:
                st = os.stat(opened)
            except OSError:
                continue
            found.setdefault((st.st_dev, st.st_ino), opened)
    return tuple(found.values())


def resolve_executable(name: str) -> str:
    path = name if "/" in name else shutil.which(name)
    if not path or not os.path.exists(path):
        raise RuntimeFailure(f"cannot run '{name}': No such file or directory")
    if not os.access(path, os.X_OK) or os.path.isdir(path):
        raise RuntimeFailure(f"cannot run '{name}': Permission denied")
    return os.path.realpath(path)


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
    if elf.exports_function(symbol):
        return path
    interpreter = elf.interpreter
    if interpreter is None:
        raise RuntimeFailure(f"{path} is statically linked: it has no dynamic allocator library to probe")
    listing = subprocess.run([interpreter, "--list", path], capture_output=True, text=True, check=False)
    for line in listing.stdout.splitlines():
        if "=>" not in line:
            continue
        library = line.split("=>", 1)[1].split("(")[0].strip()
        if library.startswith("/") and exports(library, symbol):
            return library
    raise RuntimeFailure(f"{path} loads no library exporting {symbol}; use --lib PATH")
