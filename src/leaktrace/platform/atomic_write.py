"""Writing output files atomically, never through a symlink."""

from __future__ import annotations

import ctypes
import os
import secrets

from leaktrace.errors import RuntimeFailure

AT_FDCWD, AT_SYMLINK_FOLLOW, AT_EMPTY_PATH = -100, 0x400, 0x1000
_libc = ctypes.CDLL(None, use_errno=True)


def _link_unnamed(fd: int, path: str) -> None:
    """Gives the unnamed file open at fd a name (linkat; AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH,
    else through its /proc/self/fd link)."""
    if _libc.linkat(fd, b"", AT_FDCWD, os.fsencode(path), AT_EMPTY_PATH) == 0:
        return
    if _libc.linkat(AT_FDCWD, f"/proc/self/fd/{fd}".encode(), AT_FDCWD, os.fsencode(path), AT_SYMLINK_FOLLOW) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.fsync(fd)


def write_atomically(path: str, data: bytes) -> None:
    """Writes path whole or not at all: the data goes into a file with no name (O_TMPFILE),
    which is then linked beside path and renamed over it, so a crash or a full disk leaves
    no partial file under any name (where the file system has no O_TMPFILE, a named
    temporary file, removed on failure). A symlink at path is refused, as malloc_debug's
    O_NOFOLLOW open refuses it."""
    if os.path.islink(path):
        raise RuntimeFailure(f"refusing to write {path}: it is a symbolic link")
    directory = os.path.dirname(path) or "."
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    try:
        try:
            fd = os.open(directory, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644)
            named = False
        except OSError:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            named = True
        try:
            _write_all(fd, data)
            if not named:
                _link_unnamed(fd, temporary)
                named = True
            os.rename(temporary, path)
        except BaseException:
            if named:
                os.unlink(temporary)
            raise
        finally:
            os.close(fd)
    except OSError as e:
        raise RuntimeFailure(f"cannot write {path}: {e.strerror}") from None
