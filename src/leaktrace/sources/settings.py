"""What a trace is asked to keep and how, for either engine: the settings the trace command
derives from its flags and the API takes. A module of its own, without bcc, so that the
in-process engine starts without importing the BPF one."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from leaktrace.platform.arch import HOST
from leaktrace.sources.sampling import EXACT, Sampling


@dataclass(frozen=True)
class EngineSettings:
    stack_depth: int = 16  # malloc_debug's backtrace=N
    size_min: int = 0  # sizes in [size_min, size_max] get a stack
    size_max: int = HOST.size_max
    max_live: int = 1_200_000  # live allocations held
    max_sites: int = 262_144  # distinct (pid, stack, size)
    max_stacks: int = 65_536  # distinct stacks
    max_procs: int = 32_768  # processes known at once (with fork following, and --all)
    max_threads: int = 32_768  # threads with a call in flight at once, before Linux 5.11 (after: no limit)
    follow_forks: bool = False  # trace children, with the blocks they inherit
    # --leak-check: judge valgrind's kinds at exits; with fork following, whole processes are
    # held in _exit for it from the first probe on (a child forked at once is judged too).
    leak_check_at_exit: bool = False
    exit_allocations: bool = False  # the final snapshot lists every live pointer (for the exit leak log)
    interpreter_frames: bool = False  # walk the frames of the interpreters it runs (a stack gets more words)
    unwind: str = "dwarf"  # "dwarf": the modules' CFI rows; "fp": the frame-pointer chain
    sampling: Sampling = EXACT  # --sample: decided in the kernel, before any walk or map update
    max_unwind_rows: int = 1 << 20  # CFI rows of every module traced (12 bytes each, preallocated)
    max_unwind_pages: int = 1 << 18  # their page index: 512 bytes of code each (8 bytes each, preallocated)
    # Compiled unwind tables kept across starts (None: none kept); LEAKTRACE_CACHE_DIR overrides.
    table_cache: str | None = field(
        default_factory=lambda: os.environ.get("LEAKTRACE_CACHE_DIR", "/var/cache/leaktrace/unwind")
    )
