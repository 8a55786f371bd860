"""A directory root can trust, opened component by component without following a link.

A path such as LEAKTRACE_CACHE_DIR may pass through directories other users own; a symlink
or a directory they can rename anywhere on it would let them steer root's writes and
deletions elsewhere. Each component is opened with openat(O_NOFOLLOW | O_DIRECTORY) from
the one before, and must be owned by root or by leaktrace's user (the last one by
leaktrace's user) and writable by nobody else (a sticky directory, such as /tmp, is passed
through: its other users cannot move what they do not own). Work in it is done relative
to the descriptor, never by path.
"""

from __future__ import annotations

import os
import stat

from leaktrace.errors import RuntimeFailure

_DIRECTORY_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _trusted(st: os.stat_result, final: bool) -> str | None:
    """Why a component is not to be trusted, or None (the directory itself must be our own)."""
    if st.st_uid not in ((os.geteuid(),) if final else (0, os.geteuid())):
        return f"it is owned by uid {st.st_uid}"
    if st.st_mode & 0o022 and (final or not st.st_mode & stat.S_ISVTX):
        return "others can write to it"
    return None


def open_trusted_directory(path: str, create_mode: int | None = None) -> int:
    """A descriptor of the directory at path (an absolute path) whose every component is
    trusted; missing components are made with create_mode (None: not made). RuntimeFailure
    says which component was refused and why."""
    if not os.path.isabs(path):
        raise RuntimeFailure(f"{path}: not an absolute path")
    fd = os.open("/", _DIRECTORY_OPEN)
    walked = ""
    try:
        names = [name for name in path.split("/") if name and name != "."]
        if ".." in names:
            raise RuntimeFailure(f"{path}: '..' is not followed")
        for index, name in enumerate(names):
            walked += "/" + name
            try:
                child = os.open(name, _DIRECTORY_OPEN, dir_fd=fd)
            except FileNotFoundError:
                if create_mode is None:
                    raise
                try:
                    os.mkdir(name, create_mode, dir_fd=fd)
                except FileExistsError:
                    pass  # made meanwhile: opened and checked as any other
                child = os.open(name, _DIRECTORY_OPEN, dir_fd=fd)
            os.close(fd)
            fd = child
            why = _trusted(os.fstat(fd), final=index == len(names) - 1)
            if why:
                raise RuntimeFailure(f"{walked}: {why}")
        return fd
    except OSError as e:
        os.close(fd)
        reason = "a symbolic link or not a directory" if e.errno in (40, 20) else e.strerror  # ELOOP, ENOTDIR
        raise RuntimeFailure(f"{walked}: {reason}") from None
    except RuntimeFailure:
        os.close(fd)
        raise
