"""Writing output files atomically, never through a symlink."""
from __future__ import annotations

import os
import secrets

from .errors import RuntimeFailure


def write_atomically(path: str, data: bytes) -> None:
    """Writes a temporary file beside path, then renames it over path.

    A symlink at path is refused, as malloc_debug's O_NOFOLLOW open refuses it.
    """
    if os.path.islink(path):
        raise RuntimeFailure(f"refusing to write {path}: it is a symbolic link")
    directory = os.path.dirname(path) or "."
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            os.unlink(temporary)
            raise
        os.rename(temporary, path)
    except OSError as e:
        raise RuntimeFailure(f"cannot write {path}: {e.strerror}") from None
