"""Files a target names, read with its rights (target_files.py): a regular file it owns is read
whole up to the bound and refused past it; a link, a FIFO and (as root) a file another uid
owns or one only root may read are refused in one line; a file not there is None; module
files open by the first path of each entry that is a regular file."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from leaktrace.errors import RuntimeFailure
from leaktrace.model.snapshot import Credentials
from leaktrace.platform.target_files import (
    RefusedFile,
    credentials_of,
    open_modules,
    read_target_file,
    unlink_target_file,
)

NOBODY = Credentials(65534, 65534, (65534,))


def me() -> Credentials:
    return credentials_of(os.getpid())


def test_credentials_are_this_process_s_file_system_identity():
    mine = me()
    assert (mine.uid, mine.gid) == (os.geteuid(), os.getegid()) and set(mine.groups) == set(os.getgroups())


def test_a_regular_file_is_read_up_to_the_bound_and_refused_past_it(tmp_path):
    named = tmp_path / "dump.txt"
    named.write_bytes(b"x" * 100)
    assert read_target_file(me(), str(named), 100) == b"x" * 100
    with pytest.raises(RefusedFile, match="larger than"):
        read_target_file(me(), str(named), 99)
    assert read_target_file(me(), str(tmp_path / "none"), 100) is None


def test_a_link_and_a_fifo_are_refused(tmp_path):
    (tmp_path / "real").write_text("secret")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(RefusedFile, match="is a symbolic link"):
        read_target_file(me(), str(tmp_path / "link"), 100)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(RefusedFile, match="refusing to read"):
        read_target_file(me(), str(tmp_path / "fifo"), 100)


def test_another_uid_s_rights_are_the_target_s():
    """As root: nobody's rights, in a directory all may enter; as a user: refused, in one line."""
    shared = tempfile.mkdtemp(prefix="leaktrace-target-files-")
    try:
        os.chmod(shared, 0o755)
        root_only, readable = os.path.join(shared, "root_only"), os.path.join(shared, "readable")
        for path, mode in ((root_only, 0o600), (readable, 0o644)):
            with open(path, "w") as f:
                f.write("theirs")
            os.chmod(path, mode)
        if os.geteuid() != 0:
            with pytest.raises(RuntimeFailure, match="needs CAP_SETUID and CAP_SETGID"):
                read_target_file(NOBODY, readable, 100)
            return
        with pytest.raises(RefusedFile, match="Permission denied"):  # nobody may not open it
            read_target_file(NOBODY, root_only, 100)
        with pytest.raises(RefusedFile, match="owned by uid 0, not by the target's uid 65534"):
            read_target_file(NOBODY, readable, 100)
        with pytest.raises(RefusedFile, match="refusing to remove"):  # nobody may not write the directory
            unlink_target_file(NOBODY, readable)
        assert os.path.exists(readable)
    finally:
        shutil.rmtree(shared)


def test_module_files_open_by_the_first_regular_path_of_each(tmp_path):
    (tmp_path / "lib.so").write_bytes(b"\x7fELF")
    os.mkfifo(tmp_path / "fifo")
    found = open_modules(me(), [[str(tmp_path / "fifo"), str(tmp_path / "lib.so")], [str(tmp_path / "none")]])
    try:
        assert found[1] is None and found[0] is not None and os.read(found[0], 4) == b"\x7fELF"
    finally:
        if found[0] is not None:
            os.close(found[0])
