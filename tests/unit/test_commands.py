"""The commands' parts that need no target: the trace command's exit statuses, the engines'
table, the outputs' parts (the gate's verdict and files, a file that cannot be written), and
`leaktrace diff` and `decode-leak-info` run whole on files of the test's own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import xml.etree.ElementTree as ET

import pytest

from leaktrace.analysis.suppressions import LeakCheckSettings
from leaktrace.android.leak_info import get_malloc_leak_info
from leaktrace.cli import main
from leaktrace.commands.decode_leak_info import DecodeLeakInfoCommand
from leaktrace.commands.diff import DiffCommand
from leaktrace.commands.engines import ENGINES, command_argv
from leaktrace.commands.outputs import UNWRITTEN_OUTPUT, AndroidFiles, LeakGate, OutputFiles, Outputs, Reports
from leaktrace.commands.trace import command_status, ending_of
from leaktrace.errors import UsageError
from leaktrace.model.snapshot import AllocationGroup, Counters, LeakCheck, LeakKind, LossRecord, ProcessInfo, Snapshot
from leaktrace.outputs.renderers import RENDERERS
from leaktrace.platform.pacing import POLL_TICK, poll_pause


def test_a_commands_ending_and_leaktraces_status_read_as_a_shells():
    assert (ending_of(None), command_status(None)) == ("exited", 0)  # not leaktrace's child
    assert (ending_of(3), command_status(3)) == ("exited with status 3", 3)
    assert (ending_of(-signal.SIGKILL), command_status(-signal.SIGKILL)) == ("was killed by SIGKILL", 137)
    assert ending_of(-99) == "was killed by signal 99"


def test_only_the_bpf_engine_traces_every_process_and_the_preload_one_says_what_it_refuses():
    assert ENGINES["bpf"].traces_every_process and not ENGINES["preload"].traces_every_process
    assert ENGINES["preload"].logs_own_leaks and not ENGINES["bpf"].logs_own_leaks
    assert {flag for flag, _ in ENGINES["preload"].refuses} == {"--older-than", "-f", "--lib"}


def test_a_command_is_split_as_a_shell_would_and_an_empty_one_is_refused():
    class Args:
        command = "prog 'two words' x"

    assert command_argv(Args()) == ["prog", "two words", "x"]
    Args.command = "   "
    with pytest.raises(UsageError):
        command_argv(Args())


def test_polls_pause_a_tick_and_nine_times_a_slow_poll():
    assert poll_pause(0.0) == POLL_TICK
    assert poll_pause(0.1) == pytest.approx(0.9)


PID = 4242
CHECK = LeakCheck(
    PID,
    (
        LossRecord(PID, LeakKind.DEFINITE, 2, 96, ()),
        LossRecord(PID, LeakKind.REACHABLE, 1, 10, ()),
    ),
    0.002,
    command="./leaks",
)


def snapshot(**changes) -> Snapshot:
    return Snapshot(
        1.0,
        (AllocationGroup(PID, 48, 2, ()),),
        Counters(allocations=2),
        processes={PID: ProcessInfo(PID, "leaks", "leaks", "")},
        **changes,
    )


def test_the_gate_judges_a_check_writes_its_files_and_sets_the_status(tmp_path, capfd):
    files = OutputFiles()
    settings = LeakCheckSettings(error_exitcode=7)
    gate = LeakGate(settings, files, str(tmp_path / "check.%p.xml"), str(tmp_path / "gate.xml"), ("leaktrace",))
    outputs = Outputs(Reports(), AndroidFiles(), files, gate)
    outputs.report(snapshot(leak_checks=(CHECK,)))
    assert gate.judged == {PID} and outputs.exit_status() == 7
    assert outputs.leaking_lines() == ["leaks in pid 4242 (./leaks): definitely lost: 96 bytes in 2 blocks"]
    assert ET.parse(tmp_path / f"check.{PID}.xml").getroot().tag == "valgrindoutput"
    gate.note_unjudged("command 'x' 9", "exited without being judged")
    cases = ET.parse(tmp_path / "gate.xml").getroot().iter("testcase")
    assert [case.get("name") for case in cases] == ["./leaks (pid 4242)", "command 'x' 9"]
    assert "definitely lost" in capfd.readouterr().out  # the text report carries the check


def test_a_file_that_cannot_be_written_is_said_and_counted(tmp_path, capfd):
    (tmp_path / "taken").mkdir()  # a directory at the path: refused, never replaced
    files = OutputFiles()
    outputs = Outputs(Reports(stdout=RENDERERS.json, files={"folded": str(tmp_path / "taken")}), AndroidFiles(), files)
    outputs.report(snapshot())
    assert files.unwritten == 1 and outputs.exit_status() == UNWRITTEN_OUTPUT
    out, err = capfd.readouterr()
    assert json.loads(out)["counters"]["allocations"] == 2
    assert err.count("\n") == 1 and str(tmp_path / "taken") in err


def test_android_files_go_to_their_paths_each_report_and_on_a_dump(tmp_path, capfd):
    prefix = str(tmp_path / "dump")
    android = AndroidFiles(leak_info=str(tmp_path / "info"), dump_prefix=prefix, dump_each_report=True)
    outputs = Outputs(Reports(), android, OutputFiles())
    outputs.report(snapshot())
    assert (tmp_path / "info").read_bytes() == get_malloc_leak_info(snapshot(), PID).buffer
    assert (tmp_path / f"dump.{PID}.txt").read_text().startswith("Android Native Heap Dump v1.2")
    os.unlink(tmp_path / f"dump.{PID}.txt")
    outputs.dump_now(snapshot())
    assert (tmp_path / f"dump.{PID}.txt").exists()
    info = get_malloc_leak_info(snapshot(), PID)
    said = f"leak info of pid 4242: overall_size {info.overall_size}, info_size {info.info_size},"
    assert said in capfd.readouterr().err


def report_file(path, groups) -> str:
    path.write_text(json.dumps({"time": 1.0, "groups": groups}) + "\n")
    return str(path)


def test_leaktrace_diff_compares_two_report_files(tmp_path, capsys):
    def group(count):
        frames = [{"address": 16, "function": "grow", "file": "g.c", "line": 3, "kind": "native"}]
        return {"pid": 1, "size": 8, "count": count, "bytes": 8 * count, "frames": frames}

    old = report_file(tmp_path / "old.json", [group(1)])
    new = report_file(tmp_path / "new.json", [group(5)])
    assert DiffCommand.name == "diff"
    assert main(["diff", old, new, "--json"]) == 0
    (site,) = json.loads(capsys.readouterr().out)["sites"]
    assert (site["before"]["bytes"], site["after"]["bytes"]) == (8, 40)
    assert main(["diff", old, str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_decode_leak_info_reads_a_buffer_file(tmp_path, capsys):
    buffer = tmp_path / "info"
    buffer.write_bytes(get_malloc_leak_info(snapshot(), PID).buffer)
    assert DecodeLeakInfoCommand.name == "decode-leak-info"
    assert main(["decode-leak-info", str(buffer), "--backtrace-size", "16"]) == 0
    assert "48" in capsys.readouterr().out
    assert main(["decode-leak-info", str(buffer), "--backtrace-size", "0"]) == 2


@pytest.mark.parametrize(
    "machine, argv, part",
    [
        ("riscv64", ["-p", "1"], "the BPF engine"),
        ("riscv64", ["-p", "1", "--engine", "preload"], "the in-process engine"),
        ("riscv64", ["heap", "-p", "1"], "the heap walk"),
        ("aarch64", ["heap", "-p", "1"], "the heap walk"),
    ],
)
def test_a_part_not_ported_to_the_machine_is_refused_in_one_line(machine, argv, part, monkeypatch, capsys):
    """Before any system call number or register of another machine is used on it: a machine
    with a table (aarch64, whose BPF engine is ported) names the part, one without names the
    tables there are."""
    real = os.uname()
    monkeypatch.setattr(os, "uname", lambda: os.uname_result((*real[:4], machine)))
    with subprocess.Popen(["sleep", "30"]) as child:  # a process of ours, not preloaded: the attach would inject
        try:
            assert main([word.format(child=child.pid) for word in argv]) == 1
        finally:
            child.kill()
    said = {
        "aarch64": f"this machine is aarch64: {part} runs on x86_64 only (docs/limits.md)",
        "riscv64": "this machine is riscv64: leaktrace knows x86_64, aarch64 only "
        "(its system calls, registers and frames)",
    }[machine]
    assert capsys.readouterr().err == f"leaktrace: {said}\n"
