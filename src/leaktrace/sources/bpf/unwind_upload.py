"""The stack walk's inputs in the kernel: each process's executable mappings and the unwind
rows and page index of each of their files, uploaded once per file."""

from __future__ import annotations

import ctypes as ct
import struct
import threading
from typing import Any

from leaktrace.interpreters.interface import Interpreter, InterpreterFile, InterpreterProcess
from leaktrace.interpreters.table import INTERPRETERS
from leaktrace.model.snapshot import ProcessInfo
from leaktrace.platform.elf import ElfFile
from leaktrace.platform.module_files import ModuleFiles, runs_on_musl
from leaktrace.platform.process import Mapping, MapsFollower
from leaktrace.sources.bpf.kernel_state import KernelState
from leaktrace.sources.bpf.maps import update_array
from leaktrace.sources.settings import EngineSettings
from leaktrace.unwind.rows import MAX_EXEC_MAPS
from leaktrace.unwind.tables import FileTable, UnwindTables, exec_map_entry


class UnwindUpload:
    """Uploading unwind tables and per-process mappings."""

    def __init__(
        self,
        kernel: KernelState,
        settings: EngineSettings,
        tables: UnwindTables,
        modules: ModuleFiles,
        notices: list[str],
    ) -> None:
        self.kernel, self.settings, self.tables, self._modules = kernel, settings, tables, modules
        self.notices = notices  # what the stack walk cannot cover, said once per image (the engine's list)
        # A file's packed rows -> (first row, row count, first page, page count) in the kernel's tables.
        self._uploaded: dict[bytes, tuple[int, int, int, int]] = {}
        self._next_row = self._next_page = 0
        # pid -> (generation, maps version, entries, whether the image had more mappings than fit)
        self._exec_maps: dict[int, tuple[int, int, dict[Mapping, bytes], bool]] = {}
        self._tables_lock = threading.Lock()  # load_tables runs in the image holds' thread too
        # Each file's interpreters (the loaders' data), and those said not walked, once a file.
        self._interpreter_files: dict[tuple, list[tuple[Interpreter, InterpreterFile]]] = {}
        self._unwalked_said: set[tuple] = set()
        self.interpreters: dict[int, InterpreterProcess] = {}  # pid -> the interpreter it runs

    def forget(self, pids: set[int]) -> None:
        """These processes exited: their mappings are loaded afresh if the pids come back."""
        with self._tables_lock:
            for pid in pids:
                self._exec_maps.pop(pid, None)
                self.interpreters.pop(pid, None)
                for interpreter in INTERPRETERS:
                    procs = self._walked_processes(interpreter)
                    if procs is not None:
                        procs.pop(ct.c_uint32(pid), None)

    def _walked_processes(self, interpreter: Interpreter) -> Any:
        """The map of the processes an interpreter's walk knows; None where the program has no such walk."""
        if not self.settings.interpreter_frames or self.kernel.bpf is None:
            return None
        try:
            return self.kernel.bpf[interpreter.kernel_map]
        except KeyError:  # compiled without it (kernel_cflags)
            return None

    def _note_interpreters(self, pid: int, gen: int, mapping: Mapping, elf: ElfFile | None, on_musl: bool) -> None:
        """Tells each interpreter's walk where the interpreter a module mapped here holds is
        (InterpreterFile.kernel_entry), or says once a file why its frames are not walked."""
        if elf is None or not self.settings.interpreter_frames:
            return
        if elf.identity not in self._interpreter_files:
            loaded = ((interpreter, interpreter.load(elf)) for interpreter in INTERPRETERS)
            self._interpreter_files[elf.identity] = [(i, found) for i, found in loaded if found is not None]
        start = elf.file_offset_to_vaddr(mapping.offset)
        for interpreter, found in self._interpreter_files[elf.identity]:
            procs = self._walked_processes(interpreter)
            if procs is None:
                continue
            unwalked = found.unwalked(in_kernel=True, on_musl=on_musl)
            if unwalked is not None:
                if (elf.identity, unwalked) not in self._unwalked_said:
                    self._unwalked_said.add((elf.identity, unwalked))
                    self.notices.append(unwalked)
                continue
            packed = found.kernel_entry(mapping.start - start, gen) if start is not None else None
            process = found.attach(pid)
            if packed is not None and process is not None:
                value = procs.Leaf()
                ct.memmove(ct.addressof(value), packed, len(packed))
                procs[ct.c_uint32(pid)] = value
                self.interpreters[pid] = process

    def _upload(self, path: str, table: FileTable) -> tuple[int, int, int, int]:
        """(first row, row count, first page, page count) of a file's table in the kernel's, uploaded
        on first use; no rows when they do not fit (its frames then go by the checked frame-pointer
        chain), no pages when they do not (its row searches then cover every row of the file).
        Either is said once."""
        if table.rows not in self._uploaded:
            rows, pages = table.row_count, table.page_count
            if self._next_row + rows > self.settings.max_unwind_rows:
                rows = pages = 0
                self.notices.append(
                    f"{path}: its {table.row_count} unwind rows do not fit the kernel's table"
                    f" ({self._next_row} of {self.settings.max_unwind_rows} used): its frames go by the"
                    " frame-pointer chain (stacks_truncated_no_rule where it fails)"
                )
            elif self._next_page + pages > self.settings.max_unwind_pages:
                pages = 0
                self.notices.append(
                    f"{path}: its page index ({table.page_count} pages) does not fit the kernel's"
                    f" ({self._next_page} of {self.settings.max_unwind_pages} used): its row searches are longer"
                )
            first_row, first_page = self._next_row, self._next_page
            if rows:
                update_array(self.kernel.bpf[b"unwind_rows"], first_row, table.rows, rows)
                self._next_row += rows
            if pages:
                update_array(self.kernel.bpf[b"unwind_pages"], first_page, table.pages, pages)
                self._next_page += pages
            self._uploaded[table.rows] = (first_row, rows, first_page, pages)
        return self._uploaded[table.rows]

    def load_tables(self, process: ProcessInfo, gen: int, maps: MapsFollower) -> None:
        """Gives the stack walk the executable mappings of the process's image gen, with the
        unwind rows of each file (compiled once per file); only mappings new to this image are
        opened, and nothing is done if they are unchanged. Called from the image holds' thread too."""
        with self._tables_lock:
            self._load_tables(process, gen, maps)

    def _load_tables(self, process: ProcessInfo, gen: int, maps: MapsFollower) -> None:
        pid = process.pid
        loaded_gen, version, entries, crowded = self._exec_maps.get(pid, (0, 0, {}, False))
        if (loaded_gen, version) == (gen, maps.version):
            return
        if loaded_gen != gen:
            entries, crowded = {}, False
        executable = maps.executable
        if len(executable) > MAX_EXEC_MAPS:
            # The lowest (the program, below the libraries) and the highest (mapped first: libc,
            # ld.so and the modules loaded at start, as libraries are mapped top-down).
            executable = executable[:1] + executable[1 - MAX_EXEC_MAPS :]
            if not crowded:
                crowded = True
                self.notices.append(
                    f"pid {pid} maps {len(maps.executable)} executable ranges, more than the stack walk's"
                    f" {MAX_EXEC_MAPS}: a frame in the lowest libraries ends its stack (stacks_truncated)"
                )
        new = [m for m in executable if m not in entries]
        on_musl = runs_on_musl(executable)
        modules = self._modules.open(process, new)
        for m in new:
            elf = modules[m.start]
            rows: FileTable | None = None
            if elf is not None and elf.file_offset_to_vaddr(m.offset) is not None and self.settings.unwind == "dwarf":
                rows = self.tables.table_of(elf)
            located = self._upload(elf.path, rows) if elf is not None and rows is not None else (0, 0, 0, 0)
            entries[m] = exec_map_entry(m, elf, rows, located)
            self._note_interpreters(pid, gen, m, elf, on_musl)
        entries = {m: entries[m] for m in executable}
        table = self.kernel.bpf[b"exec_maps"]
        value = table.Leaf()
        packed = struct.pack("<II", gen, len(entries)) + b"".join(entries.values())
        ct.memmove(ct.addressof(value), packed, len(packed))
        table[ct.c_uint32(pid)] = value
        self._exec_maps[pid] = (gen, maps.version, entries, crowded)
