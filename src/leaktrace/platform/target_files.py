"""Files a target names: opened with the target's own rights, regular files only, reads bounded.

leaktrace runs as root; a path that comes from a target (its options, its dumps, its maps) is
hostile input. Such a path is opened, read and unlinked by a short-lived thread whose
file-system identity (fsuid, fsgid, supplementary groups) is the target's, so root never
reads or deletes a file the target could not have read or deleted itself. Credentials are
per thread in the kernel; the raw system calls change only that thread's (glibc's
wrappers of setgroups would change every thread of leaktrace).
"""

from __future__ import annotations

import ctypes
import os
import stat
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from leaktrace.errors import RuntimeFailure
from leaktrace.model.snapshot import Credentials
from leaktrace.platform.system import CAP_SETGID, CAP_SETUID, has_capabilities

# x86_64 numbers: setgroups, setfsuid, setfsgid.
SYS_SETGROUPS, SYS_SETFSUID, SYS_SETFSGID = 116, 122, 123
UNTRUSTED_OPEN = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY  # a FIFO never blocks the open

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
T = TypeVar("T")


class RefusedFile(RuntimeFailure):
    """A file named by a target that leaktrace will not read: one line says why."""


def credentials_of(pid: int) -> Credentials:
    """A process's file-system identity, from /proc/PID/status."""
    fields: dict[str, list[str]] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, value = line.partition(":")
                fields[name] = value.split()
                if name == "Groups":  # after Uid and Gid
                    break
        return Credentials(int(fields["Uid"][3]), int(fields["Gid"][3]), tuple(int(g) for g in fields["Groups"]))
    except (OSError, KeyError, IndexError, ValueError):
        raise RuntimeFailure(f"cannot read pid {pid}'s credentials") from None


def run_as(credentials: Credentials, work: Callable[[], T]) -> T:
    """work() with these credentials for file access: in a new thread that takes them, or
    here for root (whose rights they are already); its result or its exception."""
    if credentials.uid == 0 and os.geteuid() == 0:
        return work()
    if (credentials.uid, credentials.gid) == (os.geteuid(), os.getegid()) and set(credentials.groups) <= set(
        os.getgroups()
    ):
        return work()  # the target's rights are ours (a command we started): nothing to take
    if not has_capabilities(CAP_SETUID, CAP_SETGID):
        raise RuntimeFailure(
            f"reading files as uid {credentials.uid} (the target's) needs CAP_SETUID and CAP_SETGID, "
            "which leaktrace does not have"
        )
    results: list[T] = []
    errors: list[BaseException] = []  # handed to the caller's thread

    def as_target() -> None:
        try:
            groups = (ctypes.c_uint32 * max(len(credentials.groups), 1))(*credentials.groups)
            if _libc.syscall(SYS_SETGROUPS, len(credentials.groups), groups) != 0:
                raise OSError(ctypes.get_errno(), "setgroups")
            _libc.syscall(SYS_SETFSGID, credentials.gid)
            _libc.syscall(SYS_SETFSUID, credentials.uid)
            # setfsuid/setfsgid report no errors; a call that cannot change anything returns the current one.
            if (_libc.syscall(SYS_SETFSUID, -1) & 0xFFFFFFFF, _libc.syscall(SYS_SETFSGID, -1) & 0xFFFFFFFF) != (
                credentials.uid,
                credentials.gid,
            ):
                raise OSError(0, "cannot take the target's file-system identity")
            results.append(work())
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=as_target, name="leaktrace-as-target", daemon=True)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return results[0]


def open_regular(path: str, flags: int = UNTRUSTED_OPEN) -> int:
    """A descriptor of path, which must be a regular file (no FIFO, device or socket): OSError otherwise."""
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, "not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bounded(fd: int, limit: int, what: str) -> bytes:
    """At most limit bytes from fd; RefusedFile if there are more (the file may still be growing)."""
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(fd, min(1 << 20, limit + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise RefusedFile(f"{what} is larger than {limit >> 20} MiB")


def read_regular(path: str, limit: int) -> bytes:
    """The contents of a regular file of at most limit bytes: OSError if it cannot be opened or is
    not a regular file, RefusedFile if it is larger."""
    fd = open_regular(path)
    try:
        return read_bounded(fd, limit, path)
    finally:
        os.close(fd)


def read_target_file(credentials: Credentials, path: str, limit: int) -> bytes | None:
    """The contents of a file the target wrote, or None if there is none. It is opened with
    the target's rights, not followed if it is a symbolic link, and must be a regular file
    that the target's uid owns, of at most limit bytes; otherwise RefusedFile says why."""

    def read() -> bytes | None:
        try:
            fd = open_regular(path, UNTRUSTED_OPEN | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as e:
            reason = "it is a symbolic link" if e.errno == 40 else e.strerror  # ELOOP
            raise RefusedFile(f"refusing to read {path}: {reason}") from None
        try:
            owner = os.fstat(fd).st_uid
            if owner != credentials.uid:
                raise RefusedFile(
                    f"refusing to read {path}: owned by uid {owner}, not by the target's uid {credentials.uid}"
                )
            return read_bounded(fd, limit, path)
        finally:
            os.close(fd)

    return run_as(credentials, read)


def unlink_target_file(credentials: Credentials, path: str) -> None:
    """Removes path with the target's rights (nothing if it does not exist); RefusedFile if it may not."""

    def unlink() -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise RefusedFile(f"refusing to remove {path}: {e.strerror}") from None

    run_as(credentials, unlink)


def open_modules(credentials: Credentials, wanted: Sequence[Sequence[str]]) -> list[int | None]:
    """Descriptors of module files a target maps, opened with its rights in one go: for each
    entry, the first of its paths that opens as a regular file (None if none does)."""

    def open_each() -> list[int | None]:
        descriptors: list[int | None] = []
        for paths in wanted:
            descriptors.append(None)
            for path in paths:
                try:
                    descriptors[-1] = open_regular(path)
                    break
                except OSError:
                    continue
        return descriptors

    return run_as(credentials, open_each)
