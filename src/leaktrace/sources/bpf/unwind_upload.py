"""The stack walk's inputs in the kernel: each process's executable mappings and the unwind
rows and page index of each of their files, uploaded once per file."""

from __future__ import annotations

import ctypes as ct
import struct
import threading
from typing import Any

from leaktrace.interpreters.python.interpreter import interpreter_version, unknown_interpreter, walked_interpreter
from leaktrace.interpreters.python.layout import PYTHON_PROC
from leaktrace.interpreters.python.versions import PythonOffsets
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
        # Each file's thread-state key and row (None: not a CPython the walk knows).
        self._pythons: dict[tuple, tuple[int, PythonOffsets] | None] = {}
        self.python_rows: dict[int, PythonOffsets] = {}  # pid -> the row of the CPython it runs

    def forget(self, pids: set[int]) -> None:
        """These processes exited: their mappings are loaded afresh if the pids come back."""
        with self._tables_lock:
            for pid in pids:
                self._exec_maps.pop(pid, None)
                self.python_rows.pop(pid, None)
                procs = self._python_procs
                if procs is not None:
                    procs.pop(ct.c_uint32(pid), None)

    @property
    def _python_procs(self) -> Any:
        """The Python walk's processes; None where the program has no Python walk."""
        if not self.settings.python_frames or self.kernel.bpf is None:
            return None
        try:
            return self.kernel.bpf[b"python_procs"]
        except KeyError:  # no BTF for the TLS base: compiled without it
            return None

    def _note_python(self, pid: int, gen: int, mapping: Mapping, elf: ElfFile | None, on_musl: bool) -> None:
        """Tells the Python walk where the thread-state key of a CPython module mapped here is,
        and its version's row; none on musl, whose thread layout the walk does not know."""
        procs = self._python_procs
        if procs is None or elf is None:
            return
        if on_musl:  # each module read once, as below
            if elf.identity not in self._pythons:
                self._pythons[elf.identity] = None
                if interpreter_version(elf) is not None:
                    self.notices.append(
                        f"{elf.path} is CPython on musl: its Python frames are left out "
                        "(the walk knows glibc's thread layout, not musl's)"
                    )
            return
        if elf.identity not in self._pythons:
            self._pythons[elf.identity] = walked_interpreter(elf)
            unknown = unknown_interpreter(elf, self._pythons[elf.identity] is not None)
            if unknown:
                self.notices.append(unknown)
        python, start = self._pythons[elf.identity], elf.file_offset_to_vaddr(mapping.offset)
        if python is not None and start is not None:
            key, row = python
            value = procs.Leaf()
            packed = PYTHON_PROC.pack(key + mapping.start - start, gen, 0, *row)
            ct.memmove(ct.addressof(value), packed, len(packed))
            procs[ct.c_uint32(pid)] = value
            self.python_rows[pid] = row

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
            self._note_python(pid, gen, m, elf, on_musl)
        entries = {m: entries[m] for m in executable}
        table = self.kernel.bpf[b"exec_maps"]
        value = table.Leaf()
        packed = struct.pack("<II", gen, len(entries)) + b"".join(entries.values())
        ct.memmove(ct.addressof(value), packed, len(packed))
        table[ct.c_uint32(pid)] = value
        self._exec_maps[pid] = (gen, maps.version, entries, crowded)
