"""Writing output files atomically, never through a symlink nor over anything but a regular file."""

from __future__ import annotations

import ctypes
import os
import secrets
import stat

from leaktrace.errors import RuntimeFailure

AT_FDCWD, AT_SYMLINK_FOLLOW, AT_EMPTY_PATH = -100, 0x400, 0x1000
_libc = ctypes.CDLL(None, use_errno=True)


def _link_unnamed(fd: int, name: str, dir_fd: int) -> None:
    """Gives the unnamed file open at fd a name (linkat; AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH,
    else through its /proc/self/fd link)."""
    if _libc.linkat(fd, b"", dir_fd, os.fsencode(name), AT_EMPTY_PATH) == 0:
        return
    if _libc.linkat(AT_FDCWD, f"/proc/self/fd/{fd}".encode(), dir_fd, os.fsencode(name), AT_SYMLINK_FOLLOW) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.fsync(fd)


_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def not_replaceable(path: str, dir_fd: int | None = None) -> str | None:
    """Why an output may not go to path (a symlink, a device, a FIFO, a directory...), or None
    when nothing is there or a regular file is."""
    try:
        mode = os.lstat(path, dir_fd=dir_fd).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        return e.strerror
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "something")
    return f"it is {kind}, not a regular file"


def write_atomically(path: str, data: bytes, dir_fd: int | None = None) -> None:
    """Writes path (relative to dir_fd when given) whole or not at all: the data goes into a
    file with no name (O_TMPFILE), which is then linked beside path and renamed over it, so a
    crash or a full disk leaves no partial file under any name (where the file system has no
    O_TMPFILE, a named temporary file, removed on failure). Anything at path but a regular
    file (a symlink, a device, a FIFO) is refused and left alone."""
    why = not_replaceable(path, dir_fd)
    if why:
        raise RuntimeFailure(f"refusing to write {path}: {why}")
    directory = os.path.dirname(path) or "."
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    at = AT_FDCWD if dir_fd is None else dir_fd
    try:
        try:
            fd = os.open(directory, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
            named = False
        except OSError:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(temporary, flags, 0o644, dir_fd=dir_fd)
            named = True
        try:
            _write_all(fd, data)
            if not named:
                _link_unnamed(fd, temporary, at)
                named = True
            why = not_replaceable(path, dir_fd)  # checked again just before the rename
            if why:
                raise RuntimeFailure(f"refusing to write {path}: {why}")
            os.rename(temporary, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            if named:
                os.unlink(temporary, dir_fd=dir_fd)
            raise
        finally:
            os.close(fd)
    except OSError as e:
        raise RuntimeFailure(f"cannot write {path}: {e.strerror}") from None
