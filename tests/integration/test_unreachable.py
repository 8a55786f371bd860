"""--unreachable on real processes: libmemunreachable's shapes (tests/integration/programs/unreachable.c),
checked while each target runs, held to valgrind's "definitely" + "indirectly lost", and
the target must carry on intact after every check."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from leaktrace import BpfTrace, EngineSettings
from leaktrace.platform.freeze import freeze_and_copy
from leaktrace.sources.preload.trace import PreloadTrace

from conftest import leaktrace_command
from helpers import TIMEOUT

# mode -> (unreachable bytes, unreachable allocations, reported leaks as
# (size, referenced_count, referenced_size, similar_count), largest total first)
SHAPES = {
    "none": (0, 0, []),
    "stack": (104, 1, [(104, 0, 0, 0)]),  # held by main's stack; a second one cleared
    "global": (300, 1, [(300, 0, 0, 0)]),  # held by a global; another never stored
    "tls": (0, 0, []),  # __thread and pthread_setspecific
    "register": (0, 0, []),  # only in r12 of a spinning thread
    "cycle": (128, 2, [(64, 1, 64, 0), (64, 1, 64, 0)]),
    "chain": (96, 3, [(32, 2, 64, 0)]),
    "diamond": (192, 4, [(48, 3, 144, 0)]),
    # The 999 ring nodes made at one call site share a backtrace: merged as "similar".
    "ring": (32000, 1000, [(32, 999, 31968, 998), (32, 999, 31968, 0)]),
    "headed_ring": (32064, 1001, [(64, 1000, 32000, 0)]),
    "interior": (0, 0, []),  # only a pointer 100 bytes into it
    "prot_none": (700, 1, [(700, 0, 0, 0)]),  # held only from a PROT_NONE page
}


class Shape:
    """tests/integration/programs/unreachable.c in one mode, launched under the BPF engine or with the
    preload library (whose own table then gives the allocations)."""

    def __init__(
        self, binary: Path, mode: str, ready: Path, settings: EngineSettings = EngineSettings(), engine: str = "bpf"
    ):
        argv = [str(binary), mode, str(ready)]
        self.trace = BpfTrace.launch(argv, settings) if engine == "bpf" else PreloadTrace.launch(argv, "backtrace=16")
        deadline = time.monotonic() + TIMEOUT
        while not ready.exists() or not ready.read_text().endswith("\n"):
            assert self.trace.poll() and time.monotonic() < deadline, "the shape never became ready"
            time.sleep(0.02)

    def finish(self) -> int:
        """Lets the target check what it holds and exit; its exit status."""
        os.kill(self.trace.pid, signal.SIGUSR1)
        assert self.trace.wait(TIMEOUT)
        self.trace.close()
        return self.trace.exit_status


def summary(report) -> tuple:
    return (
        report.leak_bytes,
        report.num_leaks,
        [(leak.size, leak.referenced_count, leak.referenced_size, leak.similar_count) for leak in report.leaks],
    )


def valgrind_lost(binary: Path, mode: str) -> tuple[int, int]:
    """(bytes, blocks) valgrind calls definitely or indirectly lost when MODE exits."""
    result = subprocess.run(
        ["valgrind", "--leak-check=full", str(binary), mode, "exit"], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert result.returncode == 0, result.stderr
    total_bytes = total_blocks = 0
    for kind in ("definitely", "indirectly"):
        found = re.search(rf"{kind} lost: ([\d,]+) bytes in ([\d,]+) blocks", result.stderr)
        if found:  # valgrind leaves the lines out when nothing at all leaked
            total_bytes += int(found.group(1).replace(",", ""))
            total_blocks += int(found.group(2).replace(",", ""))
    return total_bytes, total_blocks


@pytest.mark.parametrize("engine", ["bpf", "preload"])
@pytest.mark.parametrize("mode", sorted(SHAPES))
def test_shapes_match_upstream_and_valgrind(program, tmp_path, mode, engine):
    binary = program("unreachable")
    shape = Shape(binary, mode, tmp_path / "ready", engine=engine)
    try:
        first = shape.trace.check_unreachable()
        second = shape.trace.check_unreachable()  # stable when repeated, and harmless
    finally:
        status = shape.finish()
    assert summary(first) == SHAPES[mode][:2] + (SHAPES[mode][2],)
    assert summary(second) == summary(first)
    assert first.complete and first.pause_seconds < 1.0
    assert status == 0, "the target's data was damaged by the check"
    assert valgrind_lost(binary, mode) == (first.leak_bytes, first.num_leaks)


def test_limit_and_leaks_without_backtraces(program, tmp_path):
    """1024 leaks of 16 bytes without stacks (outside the backtrace sizes) are not merged."""
    shape = Shape(program("unreachable"), "lots", tmp_path / "ready", EngineSettings(size_max=8))
    try:
        report = shape.trace.check_unreachable(limit=100)
    finally:
        assert shape.finish() == 0
    assert (report.leak_bytes, report.num_leaks, report.reported, len(report.leaks)) == (16384, 1024, 1024, 100)
    assert {leak.size for leak in report.leaks} == {16} and not any(leak.stack for leak in report.leaks)
    assert valgrind_lost(program("unreachable"), "lots") == (16384, 1024)


def test_cli_text_json_and_seed_options(program, tmp_path):
    binary = program("unreachable")
    ready = tmp_path / "ready"
    tool = subprocess.Popen(
        leaktrace_command("-c", f"{binary} cycle {ready}", "--unreachable", "--contents", "0.3", "1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    tool.wait(TIMEOUT)  # after one report; the command, which shares its pipes, runs on
    pid = int(ready.read_text())
    os.kill(pid, signal.SIGUSR1)
    out, err = tool.communicate(timeout=TIMEOUT)
    assert tool.returncode == 0, err
    text = out.split(f"unreachable memory of pid {pid}:\n", 1)[1]
    lines = text.splitlines()
    assert lines[:3] == ["  128 bytes in 2 unreachable allocations", "  ABI: 'x86_64'", ""]
    assert re.fullmatch(r"  64 bytes unreachable at [0-9a-f]+", lines[3])
    assert lines[4] == "   referencing 64 unreachable bytes in 1 allocation"
    assert lines[5] == "   first 32 bytes of contents:"
    assert re.fullmatch(r"   [0-9a-f]+: ([0-9a-f]{2} ){8}(11 ){8}.{8}\.{8}", lines[6])  # the pointer, then fill
    assert re.fullmatch(r"   [0-9a-f]+: (11 ){16}\.{16}", lines[7])
    assert re.fullmatch(r"          #00  pc [0-9a-f]{16}  \S+/unreachable \(make\+\d+\)", lines[8])
    assert "  to take stacks of only these sizes: --options 'backtrace_size=64'" in lines

    json_tool = subprocess.Popen(
        leaktrace_command("-c", f"{binary} headed_ring {ready}.2", "--unreachable", "--json", "0.3", "1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    json_tool.wait(TIMEOUT)
    os.kill(int(Path(f"{ready}.2").read_text()), signal.SIGUSR1)
    out, err = json_tool.communicate(timeout=TIMEOUT)
    assert json_tool.returncode == 0, err
    result = json.loads(out.splitlines()[-1])["unreachable"]
    assert (result["leak_bytes"], result["num_leaks"], result["complete"]) == (32064, 1001, True)
    [leak] = result["leaks"]
    assert (leak["size"], leak["referenced_count"], leak["referenced_size"]) == (64, 1000, 32000)
    assert leak["frames"][0]["function"] == "make" and len(leak["contents"]) == 64
    assert result["seed_options"] == "backtrace_size=64"


def test_attached_trace_judges_the_blocks_made_before_it(program, tmp_path):
    binary = program("unreachable")
    ready = tmp_path / "ready"
    target = subprocess.Popen([str(binary), "chain", str(ready)])
    try:
        deadline = time.monotonic() + TIMEOUT
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        result = subprocess.run(
            leaktrace_command("-p", str(target.pid), "--unreachable", "0.3", "1"),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert result.returncode == 0, result.stderr
        # The chain predates the trace: the heap walk finds its 3 blocks of 32 bytes (40 usable).
        assert "  120 bytes in 3 unreachable allocations" in result.stdout
        assert "  3 of the allocations judged have no stack: the heap walk found them" in result.stdout
        assert "not all known" not in result.stdout
        target.send_signal(signal.SIGUSR1)
        assert target.wait(TIMEOUT) == 0
    finally:
        target.kill()
        target.wait()


def test_freezing_survives_threads_coming_and_going_and_a_killed_tracer(program, tmp_path):
    counter = tmp_path / "count"
    churn = subprocess.Popen([str(program("threads_churn")), str(counter)], stdout=subprocess.PIPE, text=True)

    def started() -> int:  # threads the churn program has started so far
        return int.from_bytes(counter.read_bytes()[:8], "little")

    try:
        assert churn.stdout.readline() == "ready\n"
        for _ in range(20):  # threads start and exit during the freezes
            image = freeze_and_copy(churn.pid, lambda mapping: False)
            assert image.registers and image.pause_seconds < 1.0
        # A tracer killed while every thread is stopped: the threads run on.
        script = (
            "import time\n"
            "from leaktrace.platform import freeze\n"
            "stop_all = freeze._wait_and_read_registers\n"
            "def hang(pid, seized, held_signals):\n"
            "    stop_all(pid, seized, held_signals)\n"
            "    print('frozen', flush=True)\n"
            "    time.sleep(600)\n"
            "freeze._wait_and_read_registers = hang\n"
            f"freeze.freeze_and_copy({churn.pid}, lambda mapping: False)\n"
        )
        tracer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        assert tracer.stdout.readline() == "frozen\n"
        before = started()
        time.sleep(0.3)
        assert started() == before  # every thread stands still
        tracer.kill()
        tracer.wait()
        time.sleep(0.3)
        assert started() > before  # released by the kernel when its tracer died
        assert churn.poll() is None
    finally:
        churn.kill()
        churn.wait()


def test_a_target_that_exits_is_not_an_error_for_the_trace(program, tmp_path):
    shape = Shape(program("unreachable"), "chain", tmp_path / "ready")
    try:
        os.kill(shape.trace.pid, signal.SIGUSR1)
        assert shape.trace.wait(TIMEOUT)
        with pytest.raises(Exception, match="has exited"):
            shape.trace.check_unreachable()
    finally:
        shape.trace.close()
