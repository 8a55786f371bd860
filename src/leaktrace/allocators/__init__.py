"""Allocators, described once: the functions leaktrace probes (which allocate, resize or free,
and the argument registers each one's probe reads), and each allocator family: how it is
recognised, its usable-size function, its free-like extras and its heap walker where there
is one. The BPF engine and probe placement read the functions; the library of a process is
named by its family; the heap walk exists for glibc's. The preload library reads the functions
it stands in for from allocators.h, which c_header.py writes from this module.

Adding an allocator is a family here (then `python -m leaktrace.allocators.c_header`) and a
line of tests/integration/test_other_allocators.py and test_probe_placement.py (its programs
counted exactly, none of its probes single-stepped).
"""

from __future__ import annotations

from dataclasses import dataclass

from leaktrace.platform.arch import HOST

RDI, RSI, RDX = HOST.argument_registers


@dataclass(frozen=True)
class Function:
    name: str
    kind: str  # "allocates", "resizes" (realloc: frees its old block too) or "frees"
    arguments: tuple[str, ...]  # the registers its probe reads, at the call's entry
    # Where an allocator may implement it as a check, then a tail call of this function (glibc's
    # reallocarray: an overflow check, then realloc): there its calls are counted by that
    # function's probe, and it is left unprobed where its own probe would be single-stepped.
    tail_calls: str = ""


# Every allocating function leaktrace probes (each with a return probe), then free.
ALLOCATING = (
    Function("malloc", "allocates", (RDI,)),
    Function("calloc", "allocates", (RDI, RSI)),
    Function("realloc", "resizes", (RDI, RSI)),
    Function("reallocarray", "resizes", (RDI, RSI, RDX), tail_calls="realloc"),
    Function("posix_memalign", "allocates", (RDI, RDX)),
    Function("aligned_alloc", "allocates", (RSI,)),
    Function("memalign", "allocates", (RSI,)),
    Function("valloc", "allocates", (RDI,)),
    Function("pvalloc", "allocates", (RDI,)),
)
FREE = Function("free", "frees", (RDI,))


@dataclass(frozen=True)
class Family:
    name: str
    recognised_by: tuple[str, ...]  # functions only this family defines (any one names it)
    usable_size: str  # the function that gives a block's usable size
    # Functions that free or resize a block without calling free (not probed: their frees
    # show as blocks that stay live, and the address's next allocation as missed_frees).
    free_like: tuple[str, ...] = ()
    heap_walker: str | None = None  # the module that walks its heap of a process never traced
    # The functions of its libc a thread's stack begins in, where they have no CFI of their own
    # (musl's): a walk that reaches one ends there, as at _start, not cut short.
    stack_starts: tuple[str, ...] = ()
    # What the gate's judgement cannot tell of it, said when a gate traces it (empty: nothing known).
    gate_blind_spot: str = ""


# Most particular first: tcmalloc and mimalloc also export glibc's __libc_malloc, to replace it,
# and musl's static libc defines one too. musl: its libc.so's loader stage (__dls3), or in a
# static program its libc's set-up (__init_libc), which its libc.so hides.
FAMILIES = (
    Family(
        "jemalloc",
        ("mallocx",),
        "malloc_usable_size",
        free_like=("sdallocx", "dallocx", "rallocx", "xallocx"),
        gate_blind_spot=(
            "its metadata lies outside its blocks, where it counts as roots, and points to the first "
            "block of each slab: a lost block there is judged still reachable"
        ),
    ),
    Family("tcmalloc", ("tc_malloc",), "malloc_usable_size", free_like=("tc_free_sized", "tc_deletearray_sized")),
    Family("mimalloc", ("mi_malloc",), "mi_usable_size", free_like=("mi_free_size", "mi_free_aligned", "mi_realloc")),
    Family(
        "musl",
        ("__dls3", "__init_libc"),
        "malloc_usable_size",
        stack_starts=("libc_start_main_stage2", "start", "start_c11"),  # main's caller; threads'
    ),
    Family("glibc", ("__libc_malloc",), "malloc_usable_size", heap_walker="leaktrace.reachability.glibc_heap"),
)


def family_of(defined: set[str] | dict[str, int]) -> Family | None:
    """The family of a module, from the functions it defines (None: not one described here)."""
    return next((f for f in FAMILIES if any(name in defined for name in f.recognised_by)), None)
