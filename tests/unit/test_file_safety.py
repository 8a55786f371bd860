"""Output files written whole or not at all, never through a link nor over anything but a
regular file (platform/atomic_write.py); directories trusted component by component
(platform/safe_directory.py)."""

from __future__ import annotations

import os

import pytest

from leaktrace.errors import RuntimeFailure
from leaktrace.platform.atomic_write import not_replaceable, write_atomically
from leaktrace.platform.safe_directory import open_trusted_directory


def test_a_regular_file_is_replaced_whole_and_no_temporary_is_left(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("old")
    write_atomically(str(target), b"new contents")
    assert target.read_bytes() == b"new contents"
    write_atomically(str(tmp_path / "fresh.bin"), b"\0" * 100_000)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["fresh.bin", "report.json"]


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_what_is_not_a_regular_file_is_refused_and_left_alone(tmp_path, kind):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("precious")
    target = tmp_path / "out"
    if kind == "symlink":
        target.symlink_to(elsewhere)
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    assert not_replaceable(str(target)).startswith("it is a")
    with pytest.raises(RuntimeFailure, match="refusing to write .*not a regular file"):
        write_atomically(str(target), b"x")
    assert elsewhere.read_text() == "precious"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["elsewhere", "out"]


def test_a_write_relative_to_a_directory_descriptor(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        write_atomically("inside", b"data", dir_fd=fd)
    finally:
        os.close(fd)
    assert (tmp_path / "inside").read_bytes() == b"data"


def test_a_trusted_directory_is_made_and_opened(tmp_path):
    path = tmp_path / "cache" / "tables"
    fd = open_trusted_directory(str(path), create_mode=0o700)
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(path))
        assert os.stat(path).st_mode & 0o777 == 0o700
    finally:
        os.close(fd)


def test_a_link_others_writable_dotdot_and_relative_paths_are_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(RuntimeFailure, match="link: a symbolic link or not a directory"):
        open_trusted_directory(str(tmp_path / "link" / "below"), create_mode=0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(RuntimeFailure, match="shared: others can write to it"):
        open_trusted_directory(str(shared))
    with pytest.raises(RuntimeFailure, match="'..' is not followed"):
        open_trusted_directory(str(real / ".." / "real"))
    with pytest.raises(RuntimeFailure, match="not an absolute path"):
        open_trusted_directory("relative/dir")
    with pytest.raises(RuntimeFailure, match="missing"):
        open_trusted_directory(str(tmp_path / "missing"))
