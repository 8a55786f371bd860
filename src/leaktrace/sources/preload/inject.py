"""Putting the library into a running process that was not started with it, and taking its
hooks out again: the process calls its own libc's dlopen on the library, then the library's
leaktrace_attach (native/hooks.c), through one of its threads held with ptrace
(platform/remote_call.py); leaktrace_detach puts every hook back."""

from __future__ import annotations

import os

from leaktrace.errors import RuntimeFailure
from leaktrace.model.snapshot import ProcessInfo
from leaktrace.platform.elf import ElfFile
from leaktrace.platform.module_files import ModuleFiles
from leaktrace.platform.process import Mapping, MapsFollower, alive, parse_maps, read_target, status_field
from leaktrace.platform.remote_call import RemoteCaller
from leaktrace.sources.preload.table import library_base, preload_library

RTLD_NOW = 2
ERROR_READ_LIMIT = 512  # bytes of dlerror's message read from the target
ATTACH_ERRORS = {
    1: "the options are bad, or change how blocks are laid out (guards, expand_alloc, free_track)",
    2: "another leaktrace is attached to it",
    3: "the library could not start its watcher thread",
}


def _refusal(pid: int, info: ProcessInfo, executable: list[Mapping]) -> str | None:
    """Why the library cannot be put into pid safely, or None."""
    tracer = status_field(pid, "TracerPid")
    if tracer not in (None, "0"):
        return f"pid {pid} is traced by pid {tracer} (a debugger?)"
    if status_field(pid, "Seccomp") not in (None, "0"):
        return f"pid {pid} runs under a seccomp filter: loading a library may be forbidden there"
    if not any(os.path.basename(m.path).startswith("ld-linux") for m in executable):
        return f"pid {pid} ({info.comm}) has no dynamic loader (a static program)"
    return None


class Injection:
    """The library loaded into pid and its hooks in place, until detach()."""

    def __init__(self, pid: int, options: str):
        try:
            self._put_in(pid, options)
        except OSError as e:  # the process (or the thread held) went, or the kernel refused a step
            if not alive(pid):
                raise RuntimeFailure(f"pid {pid} exited while leaktrace's library was being put in") from None
            raise RuntimeFailure(f"cannot attach in-process to pid {pid}: {e.strerror or e}") from None

    def _put_in(self, pid: int, options: str) -> None:
        info = read_target(pid)
        maps = MapsFollower()
        maps.follow(info.maps)
        refused = _refusal(pid, info, maps.executable)
        if refused:
            raise RuntimeFailure(f"cannot attach in-process: {refused}")
        self.pid = pid
        self._forbidden, functions = self._survey(info, maps.executable)
        if "dlopen" not in functions:
            raise RuntimeFailure(f"cannot attach in-process: pid {pid} has no glibc dlopen (glibc 2.34 or later)")
        library = preload_library()
        caller = RemoteCaller(pid, self._forbidden)
        try:
            handle, _ = caller.call(functions["dlopen"], [-1, RTLD_NOW], library.encode() + b"\0")
            if not handle:
                message, _ = caller.call(functions["dlerror"], []) if "dlerror" in functions else (0, 0)
                why = self._read_string(pid, message) if message else "no reason given"
                raise RuntimeFailure(f"cannot attach in-process: pid {pid} could not load {library}: {why}")
            attach = self._library_function(pid, "leaktrace_attach")
            result, _ = caller.call(attach, [-1, os.getpid()], options.encode() + b"\0")
        finally:
            caller.release()
        if result:
            raise RuntimeFailure(f"cannot attach in-process to pid {pid}: {ATTACH_ERRORS.get(result, result)}")

    @staticmethod
    def _survey(info: ProcessInfo, executable: list[Mapping]) -> tuple[list[tuple[int, int]], dict[str, int]]:
        """The code no held thread may be in (the loader, libc, any allocator, this library and
        its unwinder), and libc's dlopen and dlerror in the process."""
        forbidden, functions = [], {}
        files = ModuleFiles().open(info, executable)
        for m in executable:
            elf, name = files.get(m.start), os.path.basename(m.path)
            allocator = elf is not None and elf.exports_function("malloc")  # this library exports it too
            if allocator or name.startswith(("ld-linux", "libgcc_s")):
                forbidden.append((m.start, m.end))
            vaddr = elf.file_offset_to_vaddr(m.offset) if elf is not None else None
            if elf is not None and vaddr is not None and name.startswith("libc.so"):
                exported = elf.dynamic_functions
                for function in ("dlopen", "dlerror"):
                    if function in exported:
                        functions[function] = m.start - vaddr + exported[function]
        return forbidden, functions

    @staticmethod
    def _library_function(pid: int, name: str) -> int:
        base = library_base(parse_maps(read_target(pid).maps), preload_library())
        if base is None:
            raise RuntimeFailure(f"cannot attach in-process: pid {pid} loaded the library, then lost it")
        return base + ElfFile(preload_library()).dynamic_functions[name]

    @staticmethod
    def _read_string(pid: int, address: int) -> str:
        try:
            with open(f"/proc/{pid}/mem", "rb", buffering=0) as memory:
                memory.seek(address)
                return memory.read(ERROR_READ_LIMIT).split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            return "its message could not be read"

    def detach(self) -> None:
        """Every hook back; the library stays loaded, idle. Nothing to do once the process is gone."""
        try:
            caller = RemoteCaller(self.pid, self._forbidden)
        except (RuntimeFailure, OSError):
            return  # gone; or never calm: its watcher puts the hooks back when leaktrace has ended
        try:
            caller.call(self._library_function(self.pid, "leaktrace_detach"), [])
        except (RuntimeFailure, OSError):
            pass  # gone meanwhile; or its watcher puts the hooks back when leaktrace has ended
        finally:
            caller.release()
