"""Which processes a systemwide or -f trace keeps (Selection): each field alone and together,
the executable's glob against this process's own program, and a process gone or hidden."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from leaktrace.sources.bpf.map_reading import TracedProcess
from leaktrace.sources.bpf.process_tracking import Selection, executable_matches

ME = os.getpid()
PROGRAM = os.path.realpath(f"/proc/{ME}/exe")


def record(comm: str = "worker", uid: int = 1000) -> TracedProcess:
    return TracedProcess(gen=1, exited=False, ignored=0, parent=0, execed=False, comm=comm, uid=uid, whole=True)


def test_an_empty_selection_keeps_every_process():
    assert Selection().matches(ME, record()) and Selection().matches(1, record("init", 0))


def test_each_field_narrows_the_selection_and_all_must_hold():
    assert Selection(pids=frozenset({ME})).matches(ME, record())
    assert not Selection(pids=frozenset({ME + 1})).matches(ME, record())
    assert Selection(comm=re.compile("ork")).matches(ME, record("worker"))  # searched, not matched whole
    assert not Selection(comm=re.compile("^ork")).matches(ME, record("worker"))
    assert Selection(uid=0).matches(ME, record(uid=0)) and not Selection(uid=0).matches(ME, record(uid=1000))
    both = Selection(comm=re.compile("worker"), uid=0)
    assert not both.matches(ME, record("worker", 1000)) and both.matches(ME, record("worker", 0))


def test_the_executable_glob_matches_the_path_or_its_last_component():
    name = os.path.basename(PROGRAM)
    assert executable_matches(ME, PROGRAM) and executable_matches(ME, name)
    assert executable_matches(ME, name[:3] + "*") and executable_matches(ME, os.path.dirname(PROGRAM) + "/*")
    assert not executable_matches(ME, "redis-server") and not executable_matches(ME, "/opt/*")
    assert Selection(exe=name).matches(ME, record()) and not Selection(exe="redis*").matches(ME, record())


def test_a_process_gone_matches_no_executable():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert not executable_matches(gone.pid, "*")
