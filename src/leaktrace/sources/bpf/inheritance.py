"""Blocks inherited across fork: each new child gets its own records of its parent's blocks."""

from __future__ import annotations

import contextlib
import ctypes as ct
import threading

from bcc.libbcc import lib

from leaktrace.abi.layout import (
    CTL_COPIES_DONE,
    CTL_FORKS,
    LIVE_KEY,
    LIVE_VAL,
)
from leaktrace.sources.bpf.kernel_state import KernelState
from leaktrace.sources.bpf.map_reading import LiveEntry, MapReader
from leaktrace.sources.bpf.maps import BPF_NOEXIST, gc_paused


class ForkInheritance:
    """Copying a parent's live records to the children that forked from it."""

    def __init__(self, kernel: KernelState, reader: MapReader) -> None:
        self.kernel, self.reader = kernel, reader
        self._copy_lock = threading.Lock()

    def copy_inherited(self) -> None:
        """Gives each new child its own records of the blocks it inherited.

        Until then the BPF program finds them in the parent (see the BPF
        source); records the child already has (its own frees and the
        parent's hand-overs) win, as every copy is inserted with NOEXIST.
        """
        with self._copy_lock:  # the main thread and the image holds' thread both copy
            self._copy_inherited()

    @gc_paused
    def _copy_inherited(self) -> None:
        forks = self.kernel.control(CTL_FORKS)
        if forks == self.kernel.control(CTL_COPIES_DONE):
            return
        inherits = self.kernel.bpf[b"inherits"]
        links = sorted(
            ((k.value, v.parent, v.parent_gen, v.fork_ts) for k, v in inherits.items()), key=lambda link: link[3]
        )
        if links:
            gens = self.reader.generations()
            by_image: dict[tuple[int, int], list[LiveEntry]] = {}
            for e in self.reader.live_entries():
                by_image.setdefault((e.tgid, e.gen), []).append(e)
            live_fd = self.kernel.bpf[b"live"].map_fd
            for child, parent, parent_gen, fork_ts in links:
                child_gen = gens.get(child)
                if child_gen is None:  # gone (or left out) before its copy was made
                    with contextlib.suppress(KeyError):
                        del inherits[ct.c_uint32(child)]
                    continue
                copied = by_image.setdefault((child, child_gen), [])
                for e in by_image.get((parent, parent_gen), ()):
                    if e.tombstone or e.ts_ns >= fork_ts:
                        continue
                    key = ct.create_string_buffer(LIVE_KEY.pack(child, child_gen, e.address), LIVE_KEY.size)
                    value = ct.create_string_buffer(LIVE_VAL.pack(e.size, e.ts_ns, e.stack_key, 1, 0), LIVE_VAL.size)
                    if lib.bpf_update_elem(live_fd, key, value, BPF_NOEXIST) == 0:
                        copied.append(e._replace(tgid=child, gen=child_gen, inherited=1))
                with contextlib.suppress(KeyError):
                    del inherits[ct.c_uint32(child)]
            slots = self.kernel.bpf[b"copy_slots"]
            waiting = {child for child, *_ in links}
            for key, child in list(slots.items()):
                if child.value in waiting:
                    with contextlib.suppress(KeyError):
                        del slots[key]
        self.kernel.set_control(CTL_COPIES_DONE, forks)
