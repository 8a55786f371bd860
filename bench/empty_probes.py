"""Runs a workload with leaktrace's probes in place but empty BPF programs behind them:
what the traps alone cost, the floor under any per-call uprobe tracer. Run as root:

    .venv/bin/python bench/empty_probes.py COMMAND ARGS...

The probes are attached as the command starts, and its output is passed through.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from bcc import BPF

from leaktrace.platform.elf import ElfFile
from leaktrace.platform.process import library_of_executable, resolve_executable
from leaktrace.sources.bpf.engine import file_offsets, place_probes
from leaktrace.sources.bpf.links import BPF_TRACE_UPROBE_MULTI, attach_uprobes

EMPTY = b"int empty(void *ctx) { return 0; }"


def probe_offsets(library: str) -> tuple[list[int], int]:
    """File offsets of leaktrace's probes in library: the allocating functions', and free's."""
    elf = ElfFile(library)
    placements = place_probes(elf, elf.dynamic_functions)
    free = placements.pop("free")
    allocating = sorted(set(file_offsets(elf, [placement.address for placement in placements.values()])))
    return allocating, file_offsets(elf, [free.address])[0]


def main() -> None:
    library = library_of_executable(resolve_executable(sys.argv[1]))
    allocating, free = probe_offsets(library)
    bpf = BPF(text=EMPTY)
    program = bpf.load_func(b"empty", BPF.KPROBE, attach_type=BPF_TRACE_UPROBE_MULTI).fd
    workload = subprocess.Popen(sys.argv[1:])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the bench's stop: the workload ends by itself
    # The links filter by the workload's pid, which its exec keeps.
    links = [
        attach_uprobes(program, library, allocating, [0] * len(allocating), workload.pid),
        attach_uprobes(program, library, allocating, [0] * len(allocating), workload.pid, returns=True),
        attach_uprobes(program, library, [free], [0], workload.pid),
    ]
    status = workload.wait()
    for link in links:
        os.close(link)
    sys.exit(status)


if __name__ == "__main__":
    main()
