"""The ELF files processes map, each opened with its process's rights and read once.

A module path comes from a target (its maps, the MAPS of its dumps) and is hostile input.
It is opened by open_modules with the process's own file-system identity, so root reads no
file the process could not have read itself. While the process lives, the very file it maps
is opened through /proc/PID/map_files/START-END (no path walk: a file renamed, replaced or
deleted since it was mapped is still the one mapped), else the path inside the process's
root, else the path as this process sees it (a process that has exited).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Iterable

from leaktrace.errors import RuntimeFailure
from leaktrace.model.snapshot import ProcessInfo
from leaktrace.platform.elf import ElfError, ElfFile, FileIdentity
from leaktrace.platform.process import Mapping, alive, parse_maps, read_process
from leaktrace.platform.target_files import open_modules


def _other_root(pid: int) -> str | None:
    """The process's root directory as the kernel names it here, when it is not this process's
    own root (a container's, a chroot's); None when it is, or cannot be told."""
    try:
        if os.path.samefile(f"/proc/{pid}/root", "/proc/self/root"):
            return None
        return os.readlink(f"/proc/{pid}/root")
    except OSError:
        return None


def _name_here(path: str, pid: int, root: str | None) -> str:
    """A path of pid's maps as this process finds the file: under /proc/PID/root for a process of
    another root, unless maps already name it whole (a chroot below this root: the kernel names
    its files from here, the root's own path first)."""
    if root is None or (root != "/" and path.startswith(root.rstrip("/") + "/")):
        return path
    return f"/proc/{pid}/root{path}"


def _candidate_paths(process: ProcessInfo, mapping: Mapping) -> tuple[str, ...]:
    if process.exited:
        return (mapping.path,)
    return (
        f"/proc/{process.pid}/map_files/{mapping.start:x}-{mapping.end:x}",
        f"/proc/{process.pid}/root{mapping.path}",
        mapping.path,
    )


DEBUG_ROOT = "/usr/lib/debug"  # where distributions install separate debug files
DEBUGINFOD_TIMEOUT = 90  # seconds for one debug file from a debuginfod server


def _from_debuginfod(build_id: str) -> ElfFile | None:
    """The debug file of this build from the debuginfod servers DEBUGINFOD_URLS names, through
    elfutils' debuginfod-find (which caches what it fetches, as its client library does);
    None when none is configured or none has it. The file is leaktrace's own download."""
    if not os.environ.get("DEBUGINFOD_URLS") or not re.fullmatch(r"[0-9a-f]{2,128}", build_id):
        return None
    try:
        fetched = subprocess.run(
            ["debuginfod-find", "debuginfo", build_id],
            capture_output=True,
            text=True,
            timeout=DEBUGINFOD_TIMEOUT,
            check=False,
        )
        debug = ElfFile(fetched.stdout.strip()) if fetched.returncode == 0 and fetched.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired, ElfError):
        return None
    return debug if debug is not None and debug.build_id == build_id else None


MINI_DEBUG_LIMIT = 64 << 20  # bytes of a module's .gnu_debugdata read, and of what it unpacks to


def mini_debug_info(elf: ElfFile) -> ElfFile | None:
    """A module's MiniDebugInfo: the xz-compressed ELF in its .gnu_debugdata that holds the
    symbols of its static functions (as Fedora ships its binaries), unpacked into memory, at
    most MINI_DEBUG_LIMIT bytes of it: the section is the target's, and may be a bomb."""
    packed = elf.file_section(".gnu_debugdata", MINI_DEBUG_LIMIT)
    if not packed:
        return None
    import lzma  # only for the modules that have one

    try:
        data = lzma.LZMADecompressor().decompress(packed, max_length=MINI_DEBUG_LIMIT)
    except lzma.LZMAError:
        return None
    fd = os.memfd_create("leaktrace-minidebuginfo", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        os.close(fd)
        return None
    try:
        return ElfFile(f"{elf.path} (.gnu_debugdata)", fd)  # it owns fd, and closes it on failure
    except ElfError:
        return None


class ModuleFiles:
    """ELF files of mapped modules, by file identity (device, inode, mtime, size)."""

    # Each module file opened while a process mapping it lived, by the device and inode its maps
    # give, for every ModuleFiles of this leaktrace: a process that has exited (its map_files
    # and root gone: a container's /fixture/prog, say) is read from the files opened for it then.
    _while_mapped: dict[tuple[str, int], ElfFile] = {}

    def __init__(self) -> None:
        self._files: dict[FileIdentity, ElfFile | None] = {}
        self._debug_files: dict[FileIdentity, ElfFile | None] = {}  # a module's identity -> its debug file

    def debug_file(self, process: ProcessInfo, elf: ElfFile) -> ElfFile | None:
        """A module's separate debug file (symbols and lines a stripped module lacks): by its
        build-id under /usr/lib/debug/.build-id, else by its .gnu_debuglink beside it, in .debug/
        beside it or under /usr/lib/debug; opened with the process's rights, and taken only if it
        is of the same build (build-id, or the link's CRC-32); else its own MiniDebugInfo; else
        from debuginfod when DEBUGINFOD_URLS is set. None if there is none."""
        if elf.identity in self._debug_files:
            return self._debug_files[elf.identity]
        found = None
        candidates: list[tuple[tuple[str, ...], Callable[[ElfFile], bool]]] = []
        if elf.build_id and len(elf.build_id) > 2:
            candidates.append(
                (
                    (f"{DEBUG_ROOT}/.build-id/{elf.build_id[:2]}/{elf.build_id[2:]}.debug",),
                    lambda debug: debug.build_id == elf.build_id,
                )
            )
        link = elf.debuglink
        if link and "/" not in link[0] and link[0] not in (".", ".."):  # a name, never a path
            name, crc = link
            directory = os.path.dirname(elf.path)
            candidates.append(
                (
                    (f"{directory}/{name}", f"{directory}/.debug/{name}", f"{DEBUG_ROOT}{directory}/{name}"),
                    lambda debug: debug.crc32() == crc,
                )
            )
        for paths, same_build in candidates:
            (fd,) = open_modules(process.credentials, [paths])
            debug = self._file(paths[0], fd) if fd is not None else None
            if debug is not None and debug is not elf and same_build(debug):
                found = debug
                break
        if found is None:
            found = mini_debug_info(elf)
        if found is None and elf.build_id:
            found = _from_debuginfod(elf.build_id)
        self._debug_files[elf.identity] = found
        return found

    def open(self, process: ProcessInfo, mappings: Iterable[Mapping]) -> dict[int, ElfFile | None]:
        """Mapping start -> its ELF file; None for a mapping of no file, of a file that is not
        ELF, or of one the process may not read."""
        mappings = list(mappings)
        files = [m for m in mappings if m.path.startswith("/")]
        found: dict[int, ElfFile | None] = {m.start: None for m in mappings}
        if not files:
            return found
        descriptors = open_modules(process.credentials, [_candidate_paths(process, m) for m in files])
        # Named as this process would find them: a container's files under its root.
        root = None if process.exited else _other_root(process.pid)
        for mapping, fd in zip(files, descriptors):
            key = (mapping.device, mapping.inode)
            if fd is not None:
                elf = found[mapping.start] = self._file(_name_here(mapping.path, process.pid, root), fd)
                if elf is not None and not process.exited:
                    ModuleFiles._while_mapped[key] = elf
            elif process.exited or not alive(process.pid):
                found[mapping.start] = ModuleFiles._while_mapped.get(key)
        return found

    def _file(self, path: str, fd: int) -> ElfFile | None:
        """The file open at fd, read once per identity (fd is closed or kept by the ElfFile)."""
        st = os.fstat(fd)
        identity = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        if identity in self._files:
            os.close(fd)
            return self._files[identity]
        try:
            elf: ElfFile | None = ElfFile(path, fd)
        except ElfError:
            elf = None
        self._files[identity] = elf
        return elf


def allocator_library_of_process(process: ProcessInfo, modules: ModuleFiles, hint: str = "") -> ElfFile:
    """The allocator module a running process uses, from its maps.

    The program itself where it defines malloc (static, or its allocator linked in: its
    definition comes first in every lookup). Else a library other than libc that exports
    malloc (jemalloc, tcmalloc, mimalloc) is preferred: when one is mapped it is almost always
    the one in use. leaktrace's own in-process library (it exports leaktrace_attach) is never
    the one: it forwards to it. hint ends the message when there is none (what the caller's
    user can do about it).
    """
    libraries: dict[str, Mapping] = {}
    program = None
    maps = parse_maps(process.maps)
    executable: str | None
    try:
        executable = os.readlink(f"/proc/{process.pid}/exe")
    except OSError:  # it has exited: its program is its first module mapped, unless that is a loader
        first = [m.path for m in maps if m.path.startswith("/")][:1]
        executable = first[0] if first and "/ld-" not in first[0] else None
    for mapping in maps:
        if mapping.path == executable and program is None:
            program = mapping
        elif ".so" in mapping.path and ("/ld-" not in mapping.path or MUSL_NAME.search(mapping.path)):
            libraries.setdefault(mapping.path, mapping)
    opened = modules.open(process, [*([program] if program else []), *libraries.values()])
    own = opened[program.start] if program else None
    try:
        if own is not None and (own.interpreter is None or own.exports_function("malloc")):
            return linked_allocator(process, modules, own)
    except ElfError as e:
        raise RuntimeFailure(f"cannot read pid {process.pid}'s program: {e}") from None
    candidates = []
    for mapping in libraries.values():
        elf = opened[mapping.start]
        try:
            if elf is not None and elf.exports_function("malloc") and not elf.exports_function("leaktrace_attach"):
                candidates.append(elf)
        except ElfError:
            continue
    if not candidates:
        raise RuntimeFailure(f"pid {process.pid} maps no library that exports malloc{hint}")
    others = [elf for elf in candidates if not _LIBC_NAME.search(elf.path)]
    return (others or candidates)[0]


def linked_allocator(process: ProcessInfo, modules: ModuleFiles, program: ElfFile) -> ElfFile:
    """program, whose allocator is linked in, named by its debug file's symbols where its own
    lack malloc (a stripped static program); refused in one line where nothing names it."""
    if "malloc" not in program.probe_functions:
        program.take_symbols_from(modules.debug_file(process, program))
    if "malloc" in program.probe_functions:
        return program
    if program.has_symtab or program.symbol_file is not None:
        raise RuntimeFailure(f"{program.path} is statically linked and defines no malloc: nothing to probe")
    raise RuntimeFailure(
        f"{program.path} is statically linked and stripped, and no debug file of it was found "
        "(by build-id under /usr/lib/debug, .gnu_debuglink, .gnu_debugdata or DEBUGINFOD_URLS): "
        "no symbol names its malloc"
    )


GLIBC_NAME = re.compile(r"/(libc\.so[.\d]*|libc-[\d.]+\.so)$")
# musl's libc: Alpine's loader, which is its libc too, and Debian's musl-gcc libc.so.
MUSL_NAME = re.compile(r"/ld-musl-[^/]*\.so[.\d]*$|-linux-musl/libc\.so$")


def runs_on_musl(maps: list[Mapping]) -> bool:
    """Whether a process's libc, as its maps show it, is musl's."""
    return any(MUSL_NAME.search(m.path) for m in maps)


_LIBC_NAME = re.compile(rf"{GLIBC_NAME.pattern}|{MUSL_NAME.pattern}")


def libc_libraries(modules: ModuleFiles) -> tuple[ElfFile, ...]:
    """Every distinct libc mapped by a running process (a container's is another file), each
    opened with the rights of the first process found mapping it; this process's own first."""
    found: dict[FileIdentity, ElfFile] = {}
    seen: set[tuple[str, int]] = set()  # (device, inode) as maps say: each file opened once
    pids = [os.getpid()] + sorted(int(name) for name in os.listdir("/proc") if name.isdigit())
    for pid in pids:
        try:
            process = read_process(pid)
        except RuntimeFailure:
            continue
        if process is None:
            continue  # gone
        libcs: dict[tuple[str, int], Mapping] = {}
        for mapping in parse_maps(process.maps):
            if _LIBC_NAME.search(mapping.path) and (mapping.device, mapping.inode) not in seen:
                libcs.setdefault((mapping.device, mapping.inode), mapping)
        if not libcs:
            continue
        seen.update(libcs)
        for elf in modules.open(process, libcs.values()).values():
            if elf is not None:
                found.setdefault(elf.identity, elf)
    return tuple(found.values())


def module_exporting(
    process: ProcessInfo, modules: ModuleFiles, named: Callable[[str], bool], function: str
) -> ElfFile | None:
    """The first module of a running process whose file name passes named and which exports
    function (its program or a library it maps); None where none does."""
    candidates: dict[str, Mapping] = {}
    for mapping in parse_maps(process.maps):
        if named(mapping.path):
            candidates.setdefault(mapping.path, mapping)
    opened = modules.open(process, candidates.values())
    for mapping in candidates.values():
        elf = opened[mapping.start]
        try:
            if elf is not None and elf.exports_function(function):
                return elf
        except ElfError:
            continue
    return None
