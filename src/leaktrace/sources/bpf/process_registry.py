"""The kernel side's process table kept tidy: processes left out of a selection, processes
that exited, and the records and stacks nothing refers to any more."""

from __future__ import annotations

import contextlib
import ctypes as ct
import struct

from leaktrace.abi.layout import (
    IGNORED_UNSELECTED,
    LIVE_KEY,
    LIVE_VAL,
    SITE_KEY,
)
from leaktrace.sources.bpf.kernel_state import KernelState
from leaktrace.sources.bpf.map_reading import MapReader
from leaktrace.sources.bpf.maps import delete_keys, dump_map, gc_paused
from leaktrace.sources.bpf.unwind_upload import UnwindUpload


class ProcessRegistry:
    """Taking processes and their records out of the kernel's tables."""

    def __init__(self, kernel: KernelState, reader: MapReader, upload: UnwindUpload) -> None:
        self.kernel, self.reader, self.upload = kernel, reader, upload

    def ignore(self, images: dict[int, int]) -> None:
        """Stops tracing these processes (pid -> generation) until they exec; sweep() then
        drops their records. One that exec'd since is left alone: its new image is judged anew."""
        procs = self.kernel.bpf[b"procs"]
        for pid, gen in images.items():
            with contextlib.suppress(KeyError):
                value = procs[ct.c_uint32(pid)]
                if not value.ignored and value.gen == gen:
                    value.ignored = IGNORED_UNSELECTED
                    procs[ct.c_uint32(pid)] = value

    def drop_processes(self, pids: set[int]) -> None:
        """Takes processes that exited out of the process table, once user space has read that
        they did (the kernel side dropped their mappings, inheritance and copy slots at their
        exit); their live and site records stay for sweep()."""
        self.upload.forget(pids)
        packed = struct.pack(f"<{len(pids)}I", *pids)
        delete_keys(self.kernel.bpf[b"procs"], packed)
        if self.kernel.holds_images:
            delete_keys(self.kernel.bpf[b"holds"], packed)

    @gc_paused
    def sweep(self, exited: dict[int, int]) -> None:
        """Drops the live and site records of images that exited (pid -> the last generation to
        drop), were replaced by an exec, or were left out; those a waiting child still inherits
        from stay; then the stacks no record left refers to. Generations only grow, and a
        process not in the table yet may be one that starts during this walk: its records stay."""
        wanted_from = {tgid: p.gen + bool(p.ignored) for tgid, p in self.reader.processes().items()}
        needed = {(v.parent, v.parent_gen) for v in self.kernel.bpf[b"inherits"].values()}

        def stale(tgid: int, gen: int) -> bool:
            return (gen <= exited.get(tgid, 0) or gen < wanted_from.get(tgid, 0)) and (tgid, gen) not in needed

        # Stacks first: one stored after this read is not looked at; one stored before it has its
        # record (made in the same program run, microseconds later) in the reads below.
        stacks, _, _ = dump_map(self.kernel.bpf[b"stacks"])
        keys, values, _ = dump_map(self.kernel.bpf[b"live"])
        referenced = self._drop_stale(
            b"live",
            LIVE_KEY,
            stale,
            ((key, value[2]) for key, value in zip(LIVE_KEY.iter_unpack(keys), LIVE_VAL.iter_unpack(values))),
        )
        keys, _, _ = dump_map(self.kernel.bpf[b"sites"])
        referenced |= self._drop_stale(b"sites", SITE_KEY, stale, ((key, key[2]) for key in SITE_KEY.iter_unpack(keys)))
        keys, _, _ = dump_map(self.kernel.bpf[b"peaks"])
        gone = [key for (key,) in struct.iter_unpack("<Q", keys) if stale(key >> 32, key & 0xFFFFFFFF)]
        delete_keys(self.kernel.bpf[b"peaks"], struct.pack(f"<{len(gone)}Q", *gone))
        unreferenced = [key for (key,) in struct.iter_unpack("<Q", stacks) if key not in referenced]
        self.reader.forget_stacks(unreferenced)
        delete_keys(self.kernel.bpf[b"stacks"], struct.pack(f"<{len(unreferenced)}Q", *unreferenced))

    def _drop_stale(self, name: bytes, key_format: struct.Struct, stale, records) -> set[int]:
        """Deletes the records of a table whose (tgid, generation) is stale; records: (key, its
        stack key). Returns the stack keys of the records that stay."""
        gone, kept = [], set()
        for key, stack_key in records:
            if stale(key[0], key[1]):
                gone.append(key_format.pack(*key))
            else:
                kept.add(stack_key)
        delete_keys(self.kernel.bpf[name], b"".join(gone))
        return kept
