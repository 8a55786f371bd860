"""Checks that the machine and our privileges can run a BPF uprobe trace."""

from __future__ import annotations

import ctypes
import os
import resource

from leaktrace.errors import RuntimeFailure
from leaktrace.platform.arch import BPF_ENGINE, HOST, check_machine

CAP_SETGID, CAP_SETUID, CAP_SYS_PTRACE, CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 6, 7, 19, 21, 38, 39
BPF_MAP_CREATE, BPF_MAP_TYPE_ARRAY = 0, 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def bpf(command: int, attr, size: int | None = None) -> int:
    """The bpf() system call on a ctypes attr (size: how much of it the command reads);
    its result, or OSError."""
    result = _libc.syscall(
        HOST.syscalls["bpf"], command, ctypes.byref(attr), ctypes.sizeof(attr) if size is None else size
    )
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def _effective_capabilities() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def has_capabilities(*capabilities: int) -> bool:
    """Every one of these capabilities is in the effective set."""
    caps = _effective_capabilities()
    return all(caps >> capability & 1 for capability in capabilities)


def check_privileges() -> None:
    """Root is not enough by itself (a container may drop capabilities): look at CapEff."""
    caps = _effective_capabilities()
    if caps >> CAP_SYS_ADMIN & 1 or (caps >> CAP_BPF & 1 and caps >> CAP_PERFMON & 1):
        return
    raise RuntimeFailure("must run as root (BPF programs and uprobes need CAP_BPF and CAP_PERFMON)")


def check_bpf() -> None:
    """Creates and closes a one-entry BPF map: the cheapest proof that bpf() works."""
    attr = (ctypes.c_uint32 * 30)(BPF_MAP_TYPE_ARRAY, 4, 4, 1)
    try:
        os.close(bpf(BPF_MAP_CREATE, attr, 20))
    except OSError as e:
        raise RuntimeFailure(f"BPF is not available: bpf(): {e.strerror}") from None


TRACEFS_PLACES = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")


def check_uprobes() -> None:
    if os.path.exists("/sys/bus/event_source/devices/uprobe/type"):
        return
    for tracefs in TRACEFS_PLACES:
        if os.path.exists(f"{tracefs}/uprobe_events"):
            return
    raise RuntimeFailure("this kernel has no uprobe support (no uprobe PMU and no tracefs uprobe_events)")


# leaktrace's own RLIMIT_MEMLOCK before lift_memlock (None: never lifted): what a command it
# launches gets back (process.launch).
memlock_before: tuple[int, int] | None = None


def lift_memlock() -> None:
    """Before Linux 5.11 the kernel charges BPF maps and programs to the user's RLIMIT_MEMLOCK
    (64 KiB by default there), which one trace's maps exceed: leaktrace lifts its own, as bcc
    does at its first refusal. Where it may not, bpf() says so."""
    global memlock_before
    current = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if current == (resource.RLIM_INFINITY, resource.RLIM_INFINITY):
        return
    try:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (OSError, ValueError):
        return
    if memlock_before is None:
        memlock_before = current


def check_system() -> None:
    """x86-64, CAP_SYS_ADMIN (or CAP_BPF and CAP_PERFMON), bpf() and uprobes: what the BPF engine needs."""
    check_machine(BPF_ENGINE)
    check_privileges()
    lift_memlock()
    check_bpf()
    check_uprobes()


def tracepoint_fields(category: str, event: str) -> dict[str, int]:
    """Field name -> offset in a tracepoint's record, from its tracefs format file."""
    for tracefs in TRACEFS_PLACES:
        try:
            with open(f"{tracefs}/events/{category}/{event}/format") as f:
                text = f.read()
        except OSError:
            continue
        fields = {}
        for line in text.splitlines():
            parts = dict(part.strip().split(":", 1) for part in line.split(";") if ":" in part)
            if "field" in parts and "offset" in parts:
                name = parts["field"].split()[-1].split("[")[0]
                fields[name] = int(parts["offset"])
        return fields
    raise RuntimeFailure(f"cannot read the {category}:{event} tracepoint's format (is tracefs mounted?)")
