"""Files named on the command line that root reads (suppression files, open_named_file): a
regular file opens; a FIFO, a directory, a link others could have made, and (as root) another
user's file in a sticky shared directory are refused in one line, without blocking; root's own
links in root's own directories are followed, up to the kernel's 40."""

from __future__ import annotations

import os

import pytest

from leaktrace.platform.named_files import LINKS_FOLLOWED, RefusedName, open_named_file

NOBODY = 65534


def refusal(path) -> str:
    with pytest.raises(RefusedName) as refused:
        open_named_file(str(path))
    return str(refused.value)


def test_a_regular_file_opens_read_only(tmp_path):
    named = tmp_path / "my.supp"
    named.write_text("{\n}\n")
    fd = open_named_file(str(named))
    try:
        assert os.read(fd, 100) == b"{\n}\n"
    finally:
        os.close(fd)


def test_what_is_not_a_regular_file_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "fifo")  # opened for reading, it would block until a writer came
    assert refusal(tmp_path / "fifo").endswith("not a regular file")
    (tmp_path / "dir").mkdir()
    assert refusal(tmp_path / "dir").endswith("not a regular file")


def test_a_link_in_a_directory_others_can_write_is_not_followed(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (tmp_path / "real.supp").write_text("")
    (shared / "link.supp").symlink_to(tmp_path / "real.supp")
    assert "symbolic link that a user other than root could have made" in refusal(shared / "link.supp")


def test_root_s_links_in_root_s_directories_are_followed_and_loops_end(tmp_path):
    (tmp_path / "real.supp").write_text("x")
    (tmp_path / "link.supp").symlink_to("real.supp")
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    if os.geteuid() != 0:  # a user's own links: refused, whoever could write the directory
        assert "could have made" in refusal(tmp_path / "link.supp")
        return
    tmp_path.chmod(0o755)
    os.close(open_named_file(str(tmp_path / "link.supp")))
    assert refusal(tmp_path / "a").endswith(f"more than {LINKS_FOLLOWED} symbolic links")


def test_another_user_s_file_in_a_sticky_shared_directory_is_refused(tmp_path):
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    planted = sticky / "their.supp"
    planted.write_text("")
    if os.geteuid() != 0:  # the user's own file there: theirs to name
        os.close(open_named_file(str(planted)))
        return
    os.chown(planted, NOBODY, NOBODY)
    assert "in a sticky directory others can write" in refusal(planted)
