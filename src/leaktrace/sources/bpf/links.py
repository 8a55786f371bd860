"""uprobe_multi links (Linux 6.6+): one bpf() call attaches a program to many places of
one file, each with a cookie the program reads to tell them apart.

bcc attaches a perf event per uprobe, and closing each one waits out an RCU grace
period of its own (17 probes took 1.4 s to detach here); a link waits once for all.
Before 6.6 each place gets a perf event of the uprobe PMU and a BPF link to it carrying the same
cookie (attach_perf_uprobes); before 5.15, which gave perf-event links their cookie, the event
runs a stub of its own that hands the cookie on (cookie_stubs.py).
"""

from __future__ import annotations

import ctypes as ct
import errno
import fcntl
import os
import re

from leaktrace.platform.arch import HOST
from leaktrace.platform.system import bpf

BPF_LINK_CREATE = 28
BPF_TRACE_UPROBE_MULTI = 48  # the program's expected attach type, and the link's
BPF_TRACE_UPROBE_SESSION = 57  # Linux 6.13+: one program at the entry and, if it asks, the return
BPF_F_UPROBE_MULTI_RETURN = 1


class _LinkCreateAttr(ct.Structure):
    """union bpf_attr as BPF_LINK_CREATE reads it for a uprobe_multi link."""

    _fields_ = [
        ("prog_fd", ct.c_uint32),
        ("target_fd", ct.c_uint32),
        ("attach_type", ct.c_uint32),
        ("flags", ct.c_uint32),
        ("path", ct.c_uint64),
        ("offsets", ct.c_uint64),
        ("ref_ctr_offsets", ct.c_uint64),
        ("cookies", ct.c_uint64),
        ("cnt", ct.c_uint32),
        ("multi_flags", ct.c_uint32),
        ("pid", ct.c_uint32),
        ("reserved", ct.c_uint32 * 8),
    ]


def attach_uprobes(
    prog_fd: int,
    path: str,
    offsets: list[int],
    cookies: list[int],
    pid: int | None,
    returns: bool = False,
    attach_type: int = BPF_TRACE_UPROBE_MULTI,
) -> int:
    """Attaches prog_fd at these file offsets of path (on return from the functions there when
    `returns`; at both in a session, the attach type the program was loaded with), in process
    pid only (None: in every process); returns the link's fd (close it to detach)."""
    count = len(offsets)
    offset_array = (ct.c_uint64 * count)(*offsets)
    cookie_array = (ct.c_uint64 * count)(*cookies)
    path_buffer = ct.create_string_buffer(os.fsencode(path))
    attr = _LinkCreateAttr(
        prog_fd=prog_fd,
        attach_type=attach_type,
        path=ct.addressof(path_buffer),
        offsets=ct.addressof(offset_array),
        cookies=ct.addressof(cookie_array),
        cnt=count,
        multi_flags=BPF_F_UPROBE_MULTI_RETURN if returns else 0,
        pid=pid or 0,  # the kernel's word for every process
    )
    return bpf(BPF_LINK_CREATE, attr)


BPF_PERF_EVENT = 41  # a link's attach type for a perf event
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_SET_BPF = 0x40042408  # _IOW('$', 8, __u32)
PERF_FLAG_FD_CLOEXEC = 8
UPROBE_PMU = "/sys/bus/event_source/devices/uprobe"


class _PerfEventAttr(ct.Structure):
    """struct perf_event_attr, as far as a uprobe of the uprobe PMU reads it (128 bytes)."""

    _fields_ = [
        ("type", ct.c_uint32),
        ("size", ct.c_uint32),
        ("config", ct.c_uint64),  # the retprobe bit, where the PMU's format says
        ("sample_period", ct.c_uint64),
        ("sample_type", ct.c_uint64),
        ("read_format", ct.c_uint64),
        ("flags", ct.c_uint64),
        ("wakeup_events", ct.c_uint32),
        ("bp_type", ct.c_uint32),
        ("uprobe_path", ct.c_uint64),  # config1
        ("probe_offset", ct.c_uint64),  # config2
        ("rest", ct.c_uint8 * 64),
    ]


class _PerfLinkAttr(ct.Structure):
    """union bpf_attr as BPF_LINK_CREATE reads it for a perf event link."""

    _fields_ = [
        ("prog_fd", ct.c_uint32),
        ("target_fd", ct.c_uint32),
        ("attach_type", ct.c_uint32),
        ("flags", ct.c_uint32),
        ("bpf_cookie", ct.c_uint64),
        ("reserved", ct.c_uint64 * 8),
    ]


def _pmu_value(name: str) -> int:
    with open(f"{UPROBE_PMU}/{name}") as f:
        return int(f.read().strip().rsplit(":", 1)[-1])


def attach_perf_uprobes(
    programs: list[int], path: str, offsets: list[int], cookies: list[int] | None, pid: int | None, returns=False
) -> list[int]:
    """attach_uprobes through a perf event per place (kernels before 6.6), each running its
    program (fd), through a link with its cookie; cookies None (before 5.15: no link carries
    one): attached to the event itself. The fds to close, links first; on failure none is left open."""
    libc = ct.CDLL(None, use_errno=True)
    pmu, retprobe_bit = _pmu_value("type"), _pmu_value("format/retprobe")
    path_buffer = ct.create_string_buffer(os.fsencode(path))
    links: list[int] = []
    events: list[int] = []
    try:
        for index, (prog_fd, offset) in enumerate(zip(programs, offsets)):
            attr = _PerfEventAttr(
                type=pmu,
                size=ct.sizeof(_PerfEventAttr),
                config=(1 << retprobe_bit) if returns else 0,
                uprobe_path=ct.addressof(path_buffer),
                probe_offset=offset,
            )
            # pid: the process's threads (the kernel filters by its address space); else every
            # process, through an event on CPU 0 (a BPF program runs on every CPU regardless).
            cpu = -1 if pid else 0
            fd = libc.syscall(
                HOST.syscalls["perf_event_open"], ct.byref(attr), pid or -1, cpu, -1, PERF_FLAG_FD_CLOEXEC
            )
            if fd < 0:
                raise OSError(ct.get_errno(), os.strerror(ct.get_errno()))
            events.append(fd)
            if cookies is None:
                fcntl.ioctl(fd, PERF_EVENT_IOC_SET_BPF, prog_fd)
            else:
                link = _PerfLinkAttr(prog_fd=prog_fd, target_fd=fd, attach_type=BPF_PERF_EVENT)
                link.bpf_cookie = cookies[index]
                links.append(bpf(BPF_LINK_CREATE, link))
            fcntl.ioctl(fd, PERF_EVENT_IOC_ENABLE, 0)
    except OSError:
        for fd in links + events:
            os.close(fd)
        raise
    return links + events


_MISMATCH = re.compile(
    r"ref_ctr_offset mismatch\. inode: 0x([0-9a-f]+) offset: 0x([0-9a-f]+) "
    r"ref_ctr_offset\(old\): 0x([0-9a-f]+)"
)


def reference_counter_conflicts(inode: int, offsets: list[int]) -> dict[int, int]:
    """File offset -> the other probe's reference counter, for each of these offsets of the file
    with this inode where the kernel log says an existing uprobe refused ours (the kernel keeps
    one uprobe per instruction, and its reference counter must match): {} if none, or if the
    log cannot be read."""
    wanted, found = set(offsets), {}
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return {}
    try:
        while True:
            try:
                record = os.read(fd, 8192).decode(errors="replace")
            except BlockingIOError:
                break  # the end of the log
            except OSError as e:
                if e.errno == errno.EPIPE:
                    continue  # records overwritten while reading: go on from the oldest kept
                break
            if not record:
                break
            seen = _MISMATCH.search(record)
            if seen and int(seen.group(1), 16) == inode and int(seen.group(2), 16) in wanted:
                found[int(seen.group(2), 16)] = int(seen.group(3), 16)
    finally:
        os.close(fd)
    return found
