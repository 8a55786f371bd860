"""Fixtures: C test programs built once per session, and a runner for the real CLI.

These tests load real BPF programs and need root. They never skip: on a
machine where BPF cannot run they fail, saying why.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

from leaktrace.platform.system import bpf

PROGRAMS = Path(__file__).parent / "programs"
DEBUG_BUILD = ["gcc", "-O0", "-g", "-fno-omit-frame-pointer", "-pthread"]  # the test programs' build
BPF_OBJ_GET_INFO_BY_FD, BPF_LINK_GET_FD_BY_ID, BPF_LINK_GET_NEXT_ID = 15, 30, 31
BPF_LINK_TYPE_UPROBE_MULTI = 12


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("programs")


@pytest.fixture(scope="session")
def program(build_dir):
    """program(name, *flags) -> path of tests/integration/programs/NAME.c compiled with frame pointers."""
    built: dict[tuple, Path] = {}

    def build(name: str, *flags: str) -> Path:
        key = (name, flags)
        if key not in built:
            out = build_dir / (name + "".join(f.replace("-", "_") for f in flags))
            subprocess.run(
                [*DEBUG_BUILD, *flags, "-o", str(out), str(PROGRAMS / f"{name}.c")],
                check=True,
            )
            built[key] = out
        return built[key]

    return build


def leaktrace_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "leaktrace.cli", *args]


def uprobe_links() -> set[int]:
    """Ids of the uprobe_multi links that exist on the machine (leaktrace attaches through them)."""
    found, link_id = set(), 0
    while True:
        attr = (ctypes.c_uint32 * 4)(link_id)
        try:
            bpf(BPF_LINK_GET_NEXT_ID, attr)
        except FileNotFoundError:
            return found  # no more links
        link_id = attr[1]
        try:
            fd = bpf(BPF_LINK_GET_FD_BY_ID, (ctypes.c_uint32 * 4)(link_id))
        except FileNotFoundError:
            continue  # gone in the meantime
        info = (ctypes.c_uint32 * 64)()
        request = (ctypes.c_uint32 * 4)(fd, ctypes.sizeof(info))
        ctypes.cast(ctypes.byref(request, 8), ctypes.POINTER(ctypes.c_uint64))[0] = ctypes.addressof(info)
        try:
            bpf(BPF_OBJ_GET_INFO_BY_FD, request)
            if info[0] == BPF_LINK_TYPE_UPROBE_MULTI:
                found.add(link_id)
        finally:
            os.close(fd)


@pytest.fixture(scope="module")
def cpu_hogs():
    """A busy loop on every core for the whole module (a module uses it with pytestmark)."""
    hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(os.cpu_count() or 1)]
    yield
    for hog in hogs:
        hog.kill()
        hog.wait()


@pytest.fixture
def probes_left_as_found():
    """Asserts that no uprobe link made during the test outlives it."""
    before = uprobe_links()
    yield
    assert uprobe_links() <= before
