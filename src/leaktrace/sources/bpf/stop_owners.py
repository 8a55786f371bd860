"""Which leaktrace holds a process stopped, shared by every leaktrace on the machine: a hash
map pinned in bpffs, an entry (tgid, stopper) per stop, written by the BPF program before
it sends SIGSTOP. A process is continued by the last of its stoppers to let it go, so that
one leaktrace (a gate, a -f or --all trace) never continues a process another still reads.

An entry's stopper is a leaktrace's pid: one that has died (without its continuer) holds
nothing, and its entries are swept."""

from __future__ import annotations

import contextlib
import ctypes as ct
import functools
import os
import signal
import stat
from typing import Any

from bcc.libbcc import lib

from leaktrace.abi.layout import STOP_OWNER, STOP_OWNERS_MAX
from leaktrace.errors import RuntimeFailure
from leaktrace.platform.process import alive
from leaktrace.platform.system import BPF_MAP_CREATE, bpf

BPFFS = "/sys/fs/bpf"
STOP_OWNERS_PIN = f"{BPFFS}/leaktrace_stop_owners_v1"
BPF_MAP_TYPE_HASH, BPF_OBJ_PIN, BPF_OBJ_GET = 1, 6, 7
BPF_FS_MAGIC = 0xCAFE4A11
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8

_libc = ct.CDLL(None, use_errno=True)


class _StatFs(ct.Structure):
    _fields_ = [("f_type", ct.c_long), ("rest", ct.c_long * 15)]


def _is_bpffs(path: str) -> bool:
    found = _StatFs()
    return _libc.statfs(path.encode(), ct.byref(found)) == 0 and found.f_type == BPF_FS_MAGIC


def pin_stop_owners() -> str:
    """The shared map's pin (made once per boot, bpffs mounted where it is not): the path the
    program's STOP_OWNERS_PIN names. A pin that root did not make is refused."""
    if not _is_bpffs(BPFFS):
        flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
        if _libc.mount(b"bpf", BPFFS.encode(), b"bpf", flags, ct.c_char_p(b"mode=0700")) != 0:
            err = ct.get_errno()
            raise OSError(err, f"cannot mount bpffs on {BPFFS}: {os.strerror(err)}")
    try:
        pinned = os.lstat(STOP_OWNERS_PIN)
    except FileNotFoundError:
        _create_pin()
        pinned = os.lstat(STOP_OWNERS_PIN)
    if pinned.st_uid != 0 or not stat.S_ISREG(pinned.st_mode) or pinned.st_mode & 0o022:
        raise RuntimeFailure(f"{STOP_OWNERS_PIN} was not made by root: remove it")
    return STOP_OWNERS_PIN


def _create_pin() -> None:
    """Creates and pins the map; another leaktrace's pin made meanwhile is as good."""
    created = (ct.c_uint32 * 5)(BPF_MAP_TYPE_HASH, STOP_OWNER.size, 8, STOP_OWNERS_MAX, 0)
    fd = bpf(BPF_MAP_CREATE, created, ct.sizeof(created))
    try:
        path = ct.create_string_buffer(STOP_OWNERS_PIN.encode())
        attr = (ct.c_uint64 * 2)(ct.addressof(path), fd)
        try:
            bpf(BPF_OBJ_PIN, attr, ct.sizeof(attr))
        except FileExistsError:
            pass
    finally:
        os.close(fd)


def open_stop_owners() -> int:
    """An fd of the shared map (pinned first if need be), the caller's to close; -1 when this
    leaktrace may not open it (capabilities without root: the pin is root's, mode 0600)."""
    try:
        path = ct.create_string_buffer(pin_stop_owners().encode())
        attr = (ct.c_uint64 * 2)(ct.addressof(path), 0)
        return bpf(BPF_OBJ_GET, attr, ct.sizeof(attr))
    except PermissionError:
        return -1
    except OSError as e:
        raise RuntimeFailure(f"cannot share stops with other leaktraces: {e.strerror}") from None


@functools.cache
def stop_owners_cflags() -> tuple[str, ...]:
    """The program's map of stops: the shared pin, or a map of its own where the pin cannot be
    opened (UNSHARED_NOTICE says so at start)."""
    fd = open_stop_owners()
    if fd < 0:
        return ("-DSTOP_OWNERS_SHARED=0",)
    os.close(fd)
    return ("-DSTOP_OWNERS_SHARED=1", f'-DSTOP_OWNERS_PIN="{STOP_OWNERS_PIN}"')


UNSHARED_NOTICE = (
    f"stops not shared with other leaktraces ({STOP_OWNERS_PIN} needs root): another leaktrace may "
    "continue a process this one reads, and a judgement it then cannot make fails loudly"
)


class StopOwners:
    """This leaktrace's side of the program's stop_owners map (the shared one, or its own),
    through an fd of its own: it outlives the program's, so that processes are let go after
    the probes are detached."""

    def __init__(self, table: Any) -> None:
        self._fd = os.dup(table.map_fd)
        self._me = os.getpid()

    def close(self) -> None:
        """Lets go every process this leaktrace still holds stopped, then closes the map."""
        if self._fd >= 0:
            mine = [tgid for tgid, stopper in self._entries() if stopper == self._me]
            for tgid in mine:  # all out before the others are looked at, once
                self._remove(tgid, self._me)
            held = self._live_holders()
            for tgid in mine:
                if tgid not in held:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(tgid, signal.SIGCONT)
            os.close(self._fd)
            self._fd = -1

    def _entries(self) -> list[tuple[int, int]]:
        """(tgid, stopper) of every entry, as many as the map holds."""
        found: list[tuple[int, int]] = []
        key, following = ct.create_string_buffer(STOP_OWNER.size), ct.create_string_buffer(STOP_OWNER.size)
        at = None
        while len(found) < STOP_OWNERS_MAX and lib.bpf_get_next_key(self._fd, at, following) == 0:
            ct.memmove(key, following, STOP_OWNER.size)
            at = key
            tgid, stopper = STOP_OWNER.unpack(key.raw)
            found.append((tgid, stopper))
        return found

    def _remove(self, tgid: int, stopper: int) -> None:
        key = ct.create_string_buffer(STOP_OWNER.pack(tgid, stopper), STOP_OWNER.size)
        lib.bpf_delete_elem(self._fd, key)

    def _live_holders(self) -> dict[int, list[int]]:
        """tgid -> the live leaktraces other than this one that hold it stopped (a dead one's
        entry is swept)."""
        holders: dict[int, list[int]] = {}
        for tgid, stopper in self._entries():
            if stopper == self._me:
                continue
            if alive(stopper):
                holders.setdefault(tgid, []).append(stopper)
            else:
                self._remove(tgid, stopper)
        return holders

    def others_holding(self, pid: int) -> list[int]:
        """The live leaktraces other than this one that hold pid stopped."""
        return self._live_holders().get(pid, [])

    def let_go(self, pid: int) -> bool:
        """This leaktrace no longer holds pid; it is continued unless another still does (its
        entry is removed before the others are looked at, so the last to let go sees none)."""
        self._remove(pid, self._me)
        if self.others_holding(pid):
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        return True

    def sweep(self) -> None:
        """Removes the entries of processes that are gone, and of leaktraces that are."""
        for tgid, stopper in self._entries():
            if not alive(tgid) or not alive(stopper):
                self._remove(tgid, stopper)
