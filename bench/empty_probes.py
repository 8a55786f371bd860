"""Runs a workload with leaktrace's probes in place but empty BPF programs behind them:
what the traps alone cost, the floor under any per-call uprobe tracer. Run as root:

    .venv/bin/python bench/empty_probes.py COMMAND ARGS...
    .venv/bin/python bench/empty_probes.py -p PID      (until SIGINT; "attached" on stdout once live)

The probes are attached as the command starts, and its output is passed through.
"""

from __future__ import annotations

import os
import signal
import sys

from bcc import BPF

from leaktrace.platform.elf import ElfFile
from leaktrace.platform.module_files import ModuleFiles, allocator_library_of_process
from leaktrace.platform.process import library_of_executable, read_target, resolve_executable
from leaktrace.sources.bpf.engine import file_offsets, place_probes
from leaktrace.sources.bpf.kernel_features import UPROBE_MULTI, offers
from leaktrace.sources.bpf.launch import spawn_gated
from leaktrace.sources.bpf.links import BPF_TRACE_UPROBE_MULTI, attach_perf_uprobes, attach_uprobes

EMPTY = b"int empty(void *ctx) { return 0; }"


def probe_offsets(library: str) -> tuple[list[int], int]:
    """File offsets of leaktrace's probes in library: the allocating functions', and free's."""
    elf = ElfFile(library)
    placements = place_probes(elf, elf.dynamic_functions)
    free = placements.pop("free")
    allocating = sorted(set(file_offsets(elf, [placement.address for placement in placements.values()])))
    return allocating, file_offsets(elf, [free.address])[0]


def attach(library: str, pid: int) -> list[int]:
    """Empty programs on leaktrace's probe spots of library, for pid: the links."""
    allocating, free = probe_offsets(library)
    bpf = BPF(text=EMPTY)
    multi = offers(UPROBE_MULTI)  # else a perf event per probe, as the engine does before Linux 6.6
    program = bpf.load_func(b"empty", BPF.KPROBE, attach_type=BPF_TRACE_UPROBE_MULTI if multi else -1).fd
    places = ((allocating, False), (allocating, True), ([free], False))
    if multi:
        return [attach_uprobes(program, library, spots, [0] * len(spots), pid, returns) for spots, returns in places]
    return [
        fd
        for spots, returns in places
        for fd in attach_perf_uprobes([program] * len(spots), library, spots, None, pid, returns)
    ]


def main() -> None:
    if sys.argv[1] == "-p":
        pid = int(sys.argv[2])
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        links = attach(allocator_library_of_process(read_target(pid), ModuleFiles()).path, pid)
        print("attached", flush=True)
        try:
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
        finally:
            for link in links:
                os.close(link)
        return
    path = resolve_executable(sys.argv[1])
    library = library_of_executable(path)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the bench's stop: the workload ends by itself
    pid, gate, errors = spawn_gated(path, sys.argv[1:])  # it execs once the probes are live
    links = attach(library, pid)  # the links filter by the workload's pid, which its exec keeps
    os.write(gate, b"x")
    os.close(gate)
    os.close(errors)
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    for link in links:
        os.close(link)
    sys.exit(status)


if __name__ == "__main__":
    main()
