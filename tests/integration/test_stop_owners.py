"""The stop_owners map every leaktrace on the machine shares: a stopped process is continued by
the last live leaktrace that holds it, never while another still does."""

from __future__ import annotations

import ctypes as ct
import os
import subprocess
import time

from bcc.libbcc import lib
from each import each

from leaktrace.abi.layout import STOP_OWNER
from leaktrace.sources.bpf.stop_owners import STOP_OWNERS_PIN, StopOwners, open_stop_owners


class PinnedTable:
    """As bcc's table of the pinned map: its fd."""

    def __init__(self, fd: int):
        self.map_fd = fd


def state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def enter(fd: int, tgid: int, stopper: int) -> None:
    """An entry as a leaktrace's BPF program writes it before its SIGSTOP."""
    key = ct.create_string_buffer(STOP_OWNER.pack(tgid, stopper), STOP_OWNER.size)
    assert lib.bpf_update_elem(fd, key, ct.byref(ct.c_uint64(time.monotonic_ns())), 0) == 0


def entries(fd: int, tgid: int) -> set[int]:
    """The stoppers that hold tgid."""
    found, at = set(), None
    key, following = ct.create_string_buffer(STOP_OWNER.size), ct.create_string_buffer(STOP_OWNER.size)
    while lib.bpf_get_next_key(fd, at, following) == 0:
        ct.memmove(key, following, STOP_OWNER.size)
        at = key
        held, stopper = STOP_OWNER.unpack(key.raw)
        if held == tgid:
            found.add(stopper)
    return found


def test_a_process_is_continued_by_the_last_live_leaktrace_that_holds_it():
    target = subprocess.Popen(["sleep", "600"])
    other = subprocess.Popen(["sleep", "600"])  # stands for another leaktrace, alive
    gone = subprocess.Popen(["true"])
    gone.wait()  # a leaktrace that died without letting go
    fd = open_stop_owners()
    owners = StopOwners(PinnedTable(fd))
    try:
        assert os.stat(STOP_OWNERS_PIN).st_uid == 0
        os.kill(target.pid, 19)
        enter(fd, target.pid, os.getpid())
        enter(fd, target.pid, other.pid)
        enter(fd, target.pid, gone.pid)
        assert not owners.let_go(target.pid)
        time.sleep(0.1)
        assert state(target.pid) == "T"
        assert entries(fd, target.pid) == {other.pid}  # its own entry gone, the dead one's swept
        other.kill()
        other.wait()
        assert owners.let_go(target.pid)
        deadline = time.monotonic() + 10
        while state(target.pid) == "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert state(target.pid) != "T"
        owners.sweep()
        assert entries(fd, target.pid) == set()
    finally:
        owners.close()
        os.close(fd)
        for process in (target, other):
            process.kill()
            process.wait()


def test_closing_lets_go_of_every_process_this_leaktrace_still_holds():
    targets = [subprocess.Popen(["sleep", "600"]) for _ in range(3)]
    fd = open_stop_owners()
    owners = StopOwners(PinnedTable(fd))
    try:
        for target in targets:
            os.kill(target.pid, 19)
            enter(fd, target.pid, os.getpid())
        owners.close()
        deadline = time.monotonic() + 10
        while any(state(target.pid) == "T" for target in targets) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(state(target.pid) != "T" for target in each(targets))
        assert all(entries(fd, target.pid) == set() for target in each(targets))
    finally:
        os.close(fd)
        for target in targets:
            target.kill()
            target.wait()
