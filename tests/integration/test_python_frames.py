"""Mixed stacks: a Python script's leaks through a C call show its functions, files and lines
in place of the interpreter's frames that ran them, in both engines, under -c and -p, for a
generator's frame and for threads that released the GIL while another ran Python code, on
each CPython version the walk knows (python_interpreters.py); under CPU hogs on every core."""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from each import each
from python_interpreters import INTERPRETERS, Interpreter, module_file, placed

from conftest import leaktrace_command
from helpers import TIMEOUT, fake_python_traced, final_report, reports, run_command, wait_for_start

pytestmark = pytest.mark.usefixtures("cpu_hogs")

DEBIAN_311 = INTERPRETERS[0]  # for the tests of what is the same in every version
SCRIPT = Path(__file__).parent / "programs" / "python_leaks.py"
SIZES = {100003: 3, 100019: 4, 100043: 2}
ENGINES = ("bpf", "preload")
PRESENT = [i for i in INTERPRETERS if i.required or i.path]  # pyenv's where present (the run's header says)
EACH = [pytest.param(e, i, id=f"{e}-{i.name}") for i in PRESENT for e in ENGINES]
# -c runs the program given: one exec'd into another root (Debian 13's) has another libc, and
# the probes -c placed are on the first program's (python.md says so).
LAUNCHED = [pytest.param(e, i, id=f"{e}-{i.name}") for i in PRESENT if i.root is None for e in ENGINES]


def line_of(name: str) -> int:
    """The line of SCRIPT whose comment names it."""
    [found] = [n for n, text in enumerate(SCRIPT.read_text().splitlines(), 1) if text.endswith(f"# {name}")]
    return found


def threading_line(threading: Path, function: str, text: str) -> int:
    """The line of threading.py's function that holds text (the call into the next frame)."""
    lines = threading.read_text().splitlines()
    start = next(n for n, line in enumerate(lines) if line.strip().startswith(f"def {function}("))
    return next(n for n, line in enumerate(lines[start:], start + 1) if text in line)


def expected_python_frames(interpreter: Interpreter, script: str) -> dict[int, list[tuple[str, str, int]]]:
    """Size -> its Python frames, innermost first: (function, file, line); script: SCRIPT's path
    as the interpreter's process names it."""
    threading = module_file(interpreter, "threading")
    here = interpreter.host_path(threading)
    allocate = ("allocate", script, line_of("ALLOCATE"))
    main = ("<module>", script, line_of("MAIN"))
    return {
        100003: [
            allocate,
            ("nested", script, line_of("NESTED")),
            ("outer", script, line_of("OUTER")),
            ("leak_all", script, line_of("LEAK_ALL")),
            main,
        ],
        100019: [
            allocate,
            ("produce", script, line_of("PRODUCE")),
            ("leak_all", script, line_of("GENERATOR_LOOP")),
            main,
        ],
        100043: [
            allocate,
            ("nested", script, line_of("NESTED")),
            ("in_thread", script, line_of("IN_THREAD")),
            ("Thread.run", threading, threading_line(here, "run", "self._target(")),
            ("Thread._bootstrap_inner", threading, threading_line(here, "_bootstrap_inner", "self.run()")),
            ("Thread._bootstrap", threading, threading_line(here, "_bootstrap", "self._bootstrap_inner()")),
        ],
    }


def check_stacks(report: dict, interpreter: Interpreter, script: str, main_freed: bool = False) -> None:
    """Each site's count, and its stacks: native frames, its Python frames in order where the
    interpreter's were, native frames out to _start (clone3 in a thread; Debian 13's libc in
    its root has no symbols for either); no interpreter frame left unspliced. A site may have
    more than one native stack: 3.12 on, the interpreter runs a generator's frame in its
    caller's eval loop once it has specialised the loop's FOR_ITER. main_freed: the script's own
    <module> frame is not named (CPython frees its code before Py_FinalizeEx)."""
    groups = [group for group in report["groups"] if group["size"] in SIZES]
    assert {size: sum(g["count"] for g in groups if g["size"] == size) for size in SIZES} == SIZES
    expected = expected_python_frames(interpreter, script)
    if main_freed:
        freed = ("<module>", script, line_of("MAIN"))
        expected = {size: [(None, None, None) if f == freed else f for f in want] for size, want in expected.items()}
    for group in groups:
        size, frames = group["size"], group["frames"]
        kinds = "".join("p" if frame["kind"] == "python" else "n" for frame in frames)
        shown = [(f["function"], f["file"], f["line"]) for f in frames if f["kind"] == "python"]
        assert shown == expected[size], (size, frames)
        assert re.fullmatch(r"n+(p+n+)+", kinds), (size, kinds)
        if interpreter.root is None:
            assert frames[-1]["function"] == ("clone3" if size == 100043 else "_start"), frames[-1]
        assert not any(f["function"] == "_PyEval_EvalFrameDefault" for f in frames)
    assert report["counters"]["python_frames_cut"] == 0


class DrainedTrace:
    """A trace whose stdout is read as it comes: a full pipe would stall the trace, and with
    it a target held at a new mapping until its tables are loaded (under TCG, reports every
    0.3 s fill a pipe before the script is ready)."""

    def __init__(self, tool: subprocess.Popen):
        self.tool, self.seen, self.lines = tool, [], queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.tool.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def until_sites_reported(self) -> None:
        """Reads the trace's reports until one holds every site (its code is read while it lives)."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("no report held the sites") from None
            assert line is not None, self.tool.stderr.read()
            self.seen.append(line)
            if line.startswith("{") and SIZES.keys() <= {group["size"] for group in json.loads(line)["groups"]}:
                return

    def ended(self) -> tuple[str, str]:
        """(stdout, stderr) once the trace has ended, which it must within TIMEOUT."""
        self.tool.wait(timeout=TIMEOUT)
        self.reader.join()
        while (line := self.lines.get()) is not None:
            self.seen.append(line)
        return "".join(self.seen), self.tool.stderr.read()


def trace_args(engine: str) -> list[str]:
    return ["--engine", engine, "--frames", "64", "--min-size", "100000", "--max-size", "100100", "--json"]


def wait_ready(ready: Path, state: str = "ready") -> None:
    """Until the script's file reads state (an attach waits for "waiting": the process is then
    the interpreter, its libraries mapped, no longer the exec chain that starts it)."""
    deadline = time.monotonic() + TIMEOUT
    while not ready.exists() or ready.read_text() != f"{state}\n":
        assert time.monotonic() < deadline, f"the script never became {state}"
        time.sleep(0.02)


def launched_until_its_exit(
    tmp_path: Path, engine: str, *options: str, interpreter: Interpreter = DEBIAN_311
) -> tuple[str, str]:
    """leaktrace -c on SCRIPT, until a report holds its sites; then the script is ended, and
    the trace's output returned (its last report is the one at the script's exit), with the
    script's path as its process names it."""
    here, script = placed(interpreter, SCRIPT, tmp_path)
    ready = here / "ready"
    command = shlex.join(interpreter.command(script, str(ready), "now"))
    tool = subprocess.Popen(
        leaktrace_command("-c", command, *trace_args(engine), *options, "0.3"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        trace = DrainedTrace(tool)
        trace.until_sites_reported()
        wait_ready(ready)
        subprocess.run(["pkill", "-TERM", "-f", f"{script} {ready}"], check=True)
        out, err = trace.ended()
    finally:
        tool.kill()
    assert tool.returncode == 0, err
    assert "Traceback" not in err
    return out, script


@pytest.mark.parametrize(("engine", "interpreter"), LAUNCHED)
def test_a_launched_script_shows_its_python_frames(engine: str, interpreter: Interpreter, tmp_path):
    out, script = launched_until_its_exit(tmp_path, engine, interpreter=interpreter)
    check_stacks(reports(out)[-1], interpreter, script)


@pytest.mark.parametrize(("engine", "interpreter"), EACH)
def test_an_attached_script_shows_its_python_frames(engine: str, interpreter: Interpreter, tmp_path):
    here, script_path = placed(interpreter, SCRIPT, tmp_path)
    seen_ready = f"{script_path.rsplit('/', 1)[0]}/ready"
    script = subprocess.Popen(interpreter.command(script_path, seen_ready, "on_signal"))
    try:
        wait_ready(here / "ready", "waiting")
        tool = subprocess.Popen(
            leaktrace_command("-p", str(script.pid), *trace_args(engine), "0.3"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started = "attached in-process" if engine == "preload" else "probes live"
        line = tool.stderr.readline()
        assert started in line, line + tool.stderr.read()
        if engine == "bpf":  # the library probed, named as it is found from here (a chroot's too)
            named = line.split(" through ", 1)[1].split(" (", 1)[0]
            assert os.path.isfile(named) and "/root/" not in named, line
        trace = DrainedTrace(tool)
        script.send_signal(signal.SIGUSR1)
        trace.until_sites_reported()
        wait_ready(here / "ready")
        tool.send_signal(signal.SIGINT)
        out, err = trace.ended()
        assert tool.returncode == 0, err
        check_stacks(reports(out)[-1], interpreter, script_path)
    finally:
        script.kill()
        script.wait()


@pytest.mark.parametrize("interpreter", PRESENT, ids=[i.name for i in PRESENT])
def test_an_attached_script_that_exits_before_any_report_is_named(interpreter: Interpreter, tmp_path):
    """-p (BPF engine), no report while the script runs (the interval is an hour): off a terminal,
    it is stopped once in Py_FinalizeEx, before the interpreter frees its functions' code
    objects, which are read then; the report at its exit names those frames. The script's own
    <module> code is freed when it ends, before Py_FinalizeEx: that frame alone is unnamed."""
    here, script_path = placed(interpreter, SCRIPT, tmp_path)
    seen_ready = f"{script_path.rsplit('/', 1)[0]}/ready"
    script = subprocess.Popen(interpreter.command(script_path, seen_ready, "on_signal"), start_new_session=True)
    try:
        wait_ready(here / "ready", "waiting")
        tool = subprocess.Popen(
            leaktrace_command("-p", str(script.pid), *trace_args("bpf"), "3600"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert "probes live" in wait_for_start(tool.stderr)
        script.send_signal(signal.SIGUSR1)
        wait_ready(here / "ready")
        script.send_signal(signal.SIGTERM)
        out, err = tool.communicate(timeout=TIMEOUT)
        assert tool.returncode == 0 and f"pid {script.pid} exited" in err, err
        check_stacks(reports(out)[-1], interpreter, script_path, main_freed=True)
        assert script.wait(timeout=TIMEOUT) == 0
    finally:
        script.kill()
        script.wait()


AT_ONCE = """import ctypes
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
def inner():
    return libc.malloc(100003)
def outer():
    return inner()
kept = outer()
"""


@pytest.mark.parametrize(("engine", "interpreter"), LAUNCHED)
def test_a_script_that_exits_at_once_is_named(engine: str, interpreter: Interpreter, tmp_path):
    """No report sees it alive (the interval is 5 s): its code objects, which the interpreter
    frees before its exit, were read when it was stopped in Py_FinalizeEx (bpf) or kept by the
    library when the frames first named them (preload)."""
    script = tmp_path / "at_once.py"
    script.write_text(AT_ONCE)
    report = final_report(run_command(["-c", shlex.join(interpreter.command(str(script))), *trace_args(engine)]))
    [group] = [group for group in report["groups"] if group["size"] == 100003]
    python = [(f["function"], f["file"], f["line"]) for f in group["frames"] if f["kind"] == "python"]
    assert python == [("inner", str(script), 5), ("outer", str(script), 7), ("<module>", str(script), 8)]


@pytest.mark.parametrize("program", ["python", "true"])
def test_a_command_that_execs_into_another_root_is_said_untraced(program):
    """-c's probes are on the libc of the command's first program: a program it execs in another
    root (Debian 13's) calls its own, so nothing of it is traced, and one line says so, whether a
    poll saw the program (python: its libc is named) or it was gone before one (true, mostly)."""
    [debian13] = [i for i in INTERPRETERS if i.root is not None]
    if program == "python":
        argv = debian13.command("-c", "import ctypes; ctypes.CDLL(None).strdup(b'x' * 100003)")
    else:
        argv = [*debian13.command()[:-1], "/usr/bin/true"]
    result = run_command(["-c", shlex.join(argv), "--json"])
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "--lib" in line]
    assert len(said) == 1 and "traced" in said[0], result.stderr
    assert all(group["size"] != 100003 for report in each(reports(result.stdout)) for group in report["groups"])


def test_outputs_name_python_frames(tmp_path):
    """Folded lines and pprof locations carry the Python functions with their files and lines."""
    folded, profile = tmp_path / "stacks.folded", tmp_path / "heap.pb.gz"
    _, script = launched_until_its_exit(tmp_path, "preload", "--folded", str(folded), "--pprof", str(profile))
    outer = f"outer ({script}:{line_of('OUTER')})"
    [line] = [line for line in folded.read_text().splitlines() if outer in line]
    assert line.index(f"leak_all ({script}:{line_of('LEAK_ALL')})") < line.index(outer)
    assert line.endswith(f" {3 * 100003}")
    listing = subprocess.run(
        ["go", "tool", "pprof", "-sample_index=inuse_space", "-traces", "-lines", str(profile)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    ).stdout
    [trace] = [block for block in listing.split("-----------+") if f" outer {script}:" in block]
    places = [line.split()[-1] for line in trace.splitlines() if script in line]
    assert places == [f"{script}:{line}" for _, _, line in expected_python_frames(DEBIAN_311, script)[100003]], trace


@pytest.mark.parametrize("engine", ENGINES)
def test_a_program_that_only_looks_like_cpython_is_never_faulted(program, tmp_path, engine):
    """fake_python exports what both engines check for CPython 3.11, named python3.11, and its
    thread state leads through unmapped memory and a page of garbage: the walk reads nothing
    outside what the process maps readable, the program ends well, and its blocks are exact."""
    fake = tmp_path / "python3.11"
    shutil.copy(program("fake_python", "-rdynamic"), fake)
    result = run_command(["-c", str(fake), "--engine", engine, "--json", "3600"])
    assert result.returncode == 0 and "done" in result.stdout, result.stderr
    report = final_report(result)
    made = [g for g in report["groups"] if g["size"] == 4321]
    assert sum(g["count"] for g in made) == 100, made
    assert all(g["frames"][0]["function"] == "make" for g in each(made)), made


@pytest.mark.parametrize("engine", ENGINES)
def test_a_version_the_walk_does_not_know_gets_native_frames_and_one_line(program, tmp_path, engine):
    """fake_python as a CPython 3.15: its blocks are exact, with native frames, and one line
    names the module and its version."""
    fake = tmp_path / "python3.15"
    shutil.copy(program("fake_python", "-rdynamic", "-DFAKE_VERSION=0x030f00a1"), fake)
    result = fake_python_traced(fake, "--engine", engine)
    said = [line for line in result.stderr.splitlines() if "CPython 3.15" in line]
    assert said == [
        f"leaktrace: {fake} is CPython 3.15, a version it does not know: leaktrace does not walk its frames"
        " (it walks 3.11, 3.12 and 3.13), so its stacks have native frames only"
    ], result.stderr


@pytest.mark.parametrize("engine", ENGINES)
def test_a_chain_of_shim_frames_that_leads_back_to_itself_ends(program, tmp_path, engine):
    """fake_python as a CPython 3.12 whose current frame is an eval-loop shim frame that calls
    itself (a shim adds no word to the stack): the walk ends within its bound, the stacks are
    counted cut, the program ends well and its blocks are exact."""
    fake = tmp_path / "python3.12"
    flags = ("-rdynamic", "-DFAKE_VERSION=0x030c01f0", "-DFAKE_CODE_SIZE=0xc0", "-DFAKE_SHIM_LOOP")
    shutil.copy(program("fake_python", *flags), fake)
    result = run_command(["-c", str(fake), "--engine", engine, "--json", "3600"], timeout=60)
    assert result.returncode == 0 and "done" in result.stdout, result.stderr
    report = final_report(result)
    assert sum(g["count"] for g in report["groups"] if g["size"] == 4321) == 100
    if engine == "preload":  # the BPF engine finds no thread-state key in fake_python's code: no walk
        assert report["counters"]["python_frames_cut"] >= 100
