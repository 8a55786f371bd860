"""Files named on leaktrace's command line that it reads as root (suppression files): opened
as the kernel's protected_symlinks and protected_regular would have them opened, and then
some, since a path may run through directories other users can write.

A path is walked one component at a time from a descriptor of the directory before it. A
symbolic link is followed only where nobody but root could have made it (the link and its
directory root's, the directory writable by root alone), so a link planted in /tmp or a
user's home never steers root's read. The file must be regular (a FIFO or a device is
refused without blocking on it), and one in a sticky directory that others can write must
be root's or the directory owner's, as protected_regular asks."""

from __future__ import annotations

import os
import stat

from leaktrace.errors import RuntimeFailure

LINKS_FOLLOWED = 40  # as the kernel's MAXSYMLINKS
_DIRECTORY = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY


class RefusedName(RuntimeFailure):
    """A named file leaktrace will not read: one line says why."""


def _root_only(directory: os.stat_result) -> bool:
    return directory.st_uid == 0 and not directory.st_mode & 0o022


def open_named_file(path: str) -> int:
    """A read-only descriptor of the regular file at path; RefusedName (or OSError, for a file
    that is not there or cannot be read) otherwise."""
    names = path.split("/")
    directory = os.open("/" if path.startswith("/") else ".", _DIRECTORY)
    followed = 0
    try:
        while names:
            name = names.pop(0)
            if name in ("", "."):
                continue
            last = all(rest in ("", ".") for rest in names)
            found = os.stat(name, dir_fd=directory, follow_symlinks=False)
            parent = os.fstat(directory)
            if stat.S_ISLNK(found.st_mode):
                if found.st_uid != 0 or not _root_only(parent):
                    raise RefusedName(
                        f"{path}: '{name}' is a symbolic link that a user other than root could have made"
                    )
                followed += 1
                if followed > LINKS_FOLLOWED:
                    raise RefusedName(f"{path}: more than {LINKS_FOLLOWED} symbolic links")
                target = os.readlink(name, dir_fd=directory)
                names[:0] = target.split("/")
                if target.startswith("/"):
                    os.close(directory)
                    directory = os.open("/", _DIRECTORY)
                continue
            if not last:
                child = os.open(name, _DIRECTORY, dir_fd=directory)
                os.close(directory)
                directory = child
                continue
            if not stat.S_ISREG(found.st_mode):
                raise RefusedName(f"{path}: not a regular file")
            sticky_shared = parent.st_mode & stat.S_ISVTX and parent.st_mode & 0o002
            if sticky_shared and found.st_uid not in (0, parent.st_uid):
                raise RefusedName(
                    f"{path}: owned by uid {found.st_uid} in a sticky directory others can write "
                    "(copy it somewhere only you can write)"
                )
            fd = os.open(name, _FILE, dir_fd=directory)
            opened = os.fstat(fd)
            if (opened.st_dev, opened.st_ino) != (found.st_dev, found.st_ino):
                os.close(fd)
                raise RefusedName(f"{path}: replaced while it was opened")
            return fd
        raise RefusedName(f"{path}: not a regular file")
    finally:
        os.close(directory)
