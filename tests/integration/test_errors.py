"""Bad input ends with one line on stderr, a documented exit status, no traceback,
and nothing left attached."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from leaktrace.platform.elf import ElfFile
from leaktrace.sources.bpf.compile import first_error_line
from leaktrace.sources.bpf.engine import place_probes

from conftest import leaktrace_command
from helpers import TIMEOUT, run_command, wait_for_start

SYS_BPF = 321
BPF_LINK_CREATE = 28


def assert_one_line_error(result: subprocess.CompletedProcess, status: int, text: str) -> None:
    assert result.returncode == status, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("leaktrace: ") and text in lines[0], lines[0]
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args,text",
    [
        (["-p", "1", "-c", "true"], "not allowed with argument"),
        (["-p", "abc"], "'abc' is not a whole number"),
        (["-p", "1", "--top", "0"], "0 is out of range"),
        (["-p", "1", "0"], "interval must be more than 0 seconds"),
        (["-p", "1", "--frames", "257"], "257 is out of range (from 1 to 256)"),
        (["-p", "1", "--options", "backtrace=300"], "bad value for option 'backtrace', value must be <= 256: 300"),
        (["-p", "1", "--options", "backtrace unknown_option"], "unknown option unknown_option"),
        (["-p", "1", "--options", "guard"], "option 'guard' works only inside the allocator"),
        (["-p", "1", "--min-size", "500", "--max-size", "100"], "(500) is larger than the largest (100)"),
        (["-c", ""], "-c needs a command"),
        (["-c", "true", "--contents"], "--contents needs --unreachable"),
        (["-p", "1", "--limit", "5"], "--limit needs --unreachable"),
        (["--all", "--unreachable"], "--unreachable checks one process"),
        (["-c", "true", "--unreachable", "--top-view"], "not in the top view"),
        (["-p", "1", "--lib", "/a", "--lib", "/b"], "--lib is given once, except with --all"),
        (["--all", "--engine", "preload"], "--engine preload traces one process"),
        (["-c", "true", "--top-view"], "--top-view needs a terminal on standard input and output"),
        (["-p", "1", "--max-live", "99999999999"], "99999999999 is out of range (from 1 to 67108864)"),
        (["heap", "-p", "1", "--limit", "-3", "--unreachable"], "-3 is out of range (at least 0)"),
        (["heap", "-p", "1", "--limit", "3"], "--limit needs --unreachable"),
        (["-p", "1", "--kill-on-exit"], "--kill-on-exit ends a command leaktrace started: use it with -c"),
    ],
)
def test_usage_errors_exit_2(args, text, probes_left_as_found):
    assert_one_line_error(run_command(args), 2, text)


def test_dead_pid_exits_1(probes_left_as_found):
    child = subprocess.Popen(["true"])
    child.wait()
    assert_one_line_error(run_command(["-p", str(child.pid)]), 1, f"no process with pid {child.pid}")


@pytest.mark.parametrize("engine", ["bpf", "preload"])
def test_kernel_thread_exits_1_saying_so(engine, probes_left_as_found):
    """pid 2 is kthreadd: it exists, but has no user address space."""
    assert_one_line_error(
        run_command(["-p", "2", "--engine", engine]),
        1,
        "pid 2 (kthreadd) is a kernel thread: it has no user heap to trace",
    )


def test_thread_id_exits_1_naming_its_process(probes_left_as_found):
    waiter = (
        "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); print('ready', flush=True)"
    )
    target = subprocess.Popen([sys.executable, "-c", waiter], stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline() == "ready\n"
        thread = max(int(tid) for tid in os.listdir(f"/proc/{target.pid}/task"))
        assert thread != target.pid
        for engine in ("bpf", "preload"):
            assert_one_line_error(
                run_command(["-p", str(thread), "--engine", engine]),
                1,
                f"{thread} is a thread of process {target.pid}: trace -p {target.pid}",
            )
    finally:
        target.kill()
        target.wait()


def test_missing_command_exits_1(probes_left_as_found):
    assert_one_line_error(
        run_command(["-c", "no-such-program-here"]), 1, "cannot run 'no-such-program-here': No such file or directory"
    )


@pytest.mark.parametrize("engine", ["bpf", "preload"])
def test_a_commands_own_exit_status_is_leaktraces(program, engine):
    """-c exits as its command did: its status, or 128 + N when signal N killed it."""
    for command, status, last in (
        ("sh -c 'exit 3'", 3, "exited with status 3"),
        ("sh -c 'kill -SEGV $$'", 128 + signal.SIGSEGV, "was killed by SIGSEGV"),
        (str(program("sites")), 0, "exited with status 0"),
    ):
        result = run_command(["-c", command, "--engine", engine, "3600"])
        assert result.returncode == status, result.stderr
        assert result.stderr.splitlines()[-1].endswith(last) and "Traceback" not in result.stderr


def test_a_library_that_is_not_a_regular_file_is_named_plainly(program, probes_left_as_found):
    result = run_command(["-c", str(program("sites")), "--lib", "/dev/zero"])
    assert_one_line_error(result, 1, "cannot read allocator library: /dev/zero: not a regular file")


def test_the_in_process_engine_refuses_a_static_program_naming_the_bpf_engine(program, probes_left_as_found):
    """LD_PRELOAD never reaches a static program (it said 'pid none: 0 live bytes')."""
    static = program("sites", "-static")
    result = run_command(["-c", str(static), "--engine", "preload"])
    assert_one_line_error(result, 1, "is statically linked: the in-process library cannot interpose")
    assert "the BPF engine" in result.stderr


def test_a_stripped_static_process_with_no_debug_file_exits_1(build_dir, probes_left_as_found):
    source = build_dir / "static_sleeper.c"
    source.write_text("#include <unistd.h>\nint main(void) { pause(); return 0; }\n")
    binary = build_dir / "static_sleeper"
    subprocess.run(["gcc", "-static", "-s", "-o", str(binary), str(source)], check=True)
    target = subprocess.Popen([str(binary)])
    try:
        assert_one_line_error(
            run_command(["-p", str(target.pid)]), 1, "is statically linked and stripped, and no debug file"
        )
    finally:
        target.kill()
        target.wait()


def test_without_privileges_exits_1(probes_left_as_found):
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to drop capabilities"
    result = subprocess.run(
        [setpriv, "--bounding-set=-all", "--inh-caps=-all", *leaktrace_command("-p", "1")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert_one_line_error(result, 1, "must run as root")


def denied(program, syscall: str, *args: str, error: int = errno.EPERM) -> subprocess.CompletedProcess:
    wrapper = program("deny_syscall")
    return subprocess.run(
        [str(wrapper), syscall, str(error), *leaktrace_command(*args)], capture_output=True, text=True, timeout=120
    )


def test_without_bpf_exits_1(program, probes_left_as_found):
    assert_one_line_error(
        denied(program, str(SYS_BPF), "-c", "true"), 1, "BPF is not available: bpf(): Operation not permitted"
    )


def test_without_uprobes_exits_1_and_leaves_nothing(program, probes_left_as_found):
    target = subprocess.Popen(["sleep", "60"])
    try:
        # A kernel without uprobes (or uprobe_multi links) refuses to make the link.
        result = denied(program, f"{SYS_BPF}:{BPF_LINK_CREATE}", "-p", str(target.pid), error=errno.EOPNOTSUPP)
        assert_one_line_error(result, 1, "cannot attach uprobes to")
        assert target.poll() is None
    finally:
        target.kill()
        target.wait()


def test_command_failing_exec_is_reaped(build_dir, probes_left_as_found):
    script = build_dir / "not-executable"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    assert_one_line_error(run_command(["-c", str(script)]), 1, "Permission denied")


def test_sigterm_gives_final_report_and_detaches(program, probes_left_as_found):
    target = subprocess.Popen(["sleep", "60"])
    try:
        tracer = subprocess.Popen(
            leaktrace_command("-p", str(target.pid), "--json", "3600"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = wait_for_start(tracer.stderr)
        assert "probes live" in line
        tracer.terminate()
        out, err = tracer.communicate(timeout=60)
        assert tracer.returncode == 0
        assert err == ""
        assert out.count("\n") == 1 and out.startswith("{")
        # Detached: the target still runs, and is not stopped.
        time.sleep(0.1)
        state = open(f"/proc/{target.pid}/stat").read().rsplit(")", 1)[1].split()[0]
        assert state in ("S", "R")
    finally:
        target.kill()
        target.wait()


def test_large_reports_arrive_whole_when_a_signal_stops_a_blocked_write(program, probes_left_as_found):
    """Reports of ~300 KB into a pipe nobody reads until SIGINT: every line still parses."""
    # The command's own output goes elsewhere: it would hold the pipes open after leaktrace exits.
    command = f"sh -c 'exec {program('workers')} sizes > /dev/null 2>&1'"
    tool = subprocess.Popen(
        leaktrace_command("-c", command, "--json", "0.2"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    started = wait_for_start(tool.stderr)
    assert "probes live" in started, started
    command_pid = int(started.split("' ")[1].split()[0])
    try:
        time.sleep(2)  # reports pile up: the pipe fills and leaktrace blocks in a write
        tool.send_signal(signal.SIGINT)
        out, err = tool.communicate(timeout=120)
    finally:
        os.kill(command_pid, signal.SIGKILL)
    assert tool.returncode == 0, err
    lines = out.splitlines()
    assert len(lines) >= 2 and all(len(line) > 131072 for line in lines[1:])
    for line in lines:
        json.loads(line)


def test_without_kernel_headers_exits_1(program, probes_left_as_found):
    """bcc's compile fails without headers (BCC_KERNEL_SOURCE names an empty directory):
    bcc's own hint, in one line, and nothing on stdout."""
    target = subprocess.Popen([str(program("idle")), "30"])
    try:
        with tempfile.TemporaryDirectory() as empty:
            result = run_command(["-p", str(target.pid), "1", "1"], env={**os.environ, "BCC_KERNEL_SOURCE": empty})
        assert_one_line_error(result, 1, "cannot load the BPF program: Unable to find kernel headers")
    finally:
        target.kill()
        target.wait()


def test_another_tools_uprobe_on_malloc_is_named(program, probes_left_as_found, tmp_path):
    """A uprobe on libc's malloc with a reference counter (perf's uprobe PMU, as bcc's Python
    attach_uprobe makes them): the kernel refuses leaktrace's link on that instruction, and
    leaktrace says why in one line, naming the function; nothing of it stays attached. The
    libc is a copy of its own: no other test's uprobe (nor one the kernel leaked) is on it."""
    libc = str(tmp_path / "libc.so.6")
    shutil.copyfile(next(line.split()[-1] for line in open("/proc/self/maps") if "/libc.so" in line), libc)
    idle = subprocess.Popen([str(program("idle")), "30"], env={**os.environ, "LD_LIBRARY_PATH": str(tmp_path)})
    holder = None
    try:
        deadline = time.monotonic() + TIMEOUT
        while libc not in Path(f"/proc/{idle.pid}/maps").read_text():  # its loader is done with it
            assert time.monotonic() < deadline, "idle never mapped the copy of libc"
            time.sleep(0.01)
        elf = ElfFile(libc)
        offset = elf.vaddr_to_file_offset(place_probes(elf, elf.dynamic_functions)["malloc"].address)
        holder = subprocess.Popen(
            [str(program("refctr_uprobe")), libc, hex(offset), "0x10"], stdout=subprocess.PIPE, text=True
        )
        assert holder.stdout.readline() == "ready\n"
        result = run_command(["-p", str(idle.pid), "1", "1"])
        assert_one_line_error(
            result,
            1,
            f"cannot attach uprobes to {libc}: another tool's uprobe is on malloc "
            f"(file offset {offset:#x}) with reference counter 0x10 (ours: 0)",
        )
    finally:
        for process in (idle, holder):
            if process:
                process.kill()
                process.wait()


def test_a_refused_program_is_named_by_the_verifiers_verdict():
    """The verifier's log ends with statistics; the line before them says what it refused
    (this log is a real one, from a program that called a helper uprobes may not use)."""
    log = (
        "25: (85) call bpf_ktime_get_coarse_ns#160\n"
        "program of this type cannot use helper bpf_ktime_get_coarse_ns#160\n"
        "processed 25 insns (limit 1000000) max_states_per_insn 0 total_states 1 peak_states 1 mark_read 0\n"
    )
    assert first_error_line(log) == "program of this type cannot use helper bpf_ktime_get_coarse_ns#160"


def test_an_output_that_cannot_be_written_exits_3_and_leaves_no_part_of_it(program, tmp_path):
    """A symlink planted at an output path is refused before the trace (exit 2); a full disk:
    one line, the trace runs to its end, exit status 3, and no partial file under any name."""
    planted = tmp_path / "leak.bin"
    planted.symlink_to("/etc/passwd")
    result = run_command(["-c", str(program("sites")), "--leak-info", str(planted), "3600"])
    assert result.returncode == 2 and "Traceback" not in result.stderr and result.stdout == ""
    assert f"refusing --leak-info {planted}: it is a symbolic link, not a regular file" in result.stderr
    assert planted.is_symlink()
    full = tmp_path / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "leaktrace-test", str(full)], check=True)
    try:
        (full / "filler").write_bytes(b"x" * 3000)
        result = run_command(
            ["-c", str(program("sites")), "--heap-dump", str(full / "heap"), "--heap-dump-on-exit", "3600"]
        )
        assert result.returncode == 3 and "Traceback" not in result.stderr
        assert "No space left on device" in result.stderr
        assert sorted(path.name for path in full.iterdir()) == ["filler"]
    finally:
        subprocess.run(["umount", str(full)], check=True)


def test_a_zombie_exits_1_saying_so(probes_left_as_found):
    """A child that exited and was not reaped has no address space any more."""
    zombie = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while open(f"/proc/{zombie.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        for engine in ("bpf", "preload"):
            assert_one_line_error(
                run_command(["-p", str(zombie.pid), "--engine", engine]), 1, f"pid {zombie.pid} has exited (a zombie)"
            )
    finally:
        zombie.wait()


def test_decode_leak_info_of_truncated_and_random_files(tmp_path):
    """A buffer cut short: one line, exit 1. Random bytes of whole entries: decoded, each entry
    no get_malloc_leak_info could have written marked, and counted on stderr."""
    cut = tmp_path / "cut.bin"
    cut.write_bytes(os.urandom(18 * 8 * 3 + 5))
    assert_one_line_error(
        run_command(["decode-leak-info", str(cut), "--backtrace-size", "16"]),
        1,
        "buffer of 437 bytes is not a whole number of 144-byte entries",
    )
    noise = tmp_path / "noise.bin"
    noise.write_bytes(os.urandom(18 * 8 * 50))
    result = run_command(["decode-leak-info", str(noise), "--backtrace-size", "16"])
    assert result.returncode == 0 and "Traceback" not in result.stderr
    assert result.stdout.startswith("50 entries, total_memory ")
    marked = sum("  !" in line for line in result.stdout.splitlines())
    assert marked >= 45 and f"{marked} entries cannot be real" in result.stderr


@pytest.mark.parametrize("engine", ["bpf", "preload"])
def test_a_command_outliving_its_trace_is_said_left_running_or_killed(engine, tmp_path):
    """COUNT reports made while the command runs on: one line says it was left running (and
    it runs); with --kill-on-exit it is killed. --folded's path is said once, not per report."""
    folded, out, err = tmp_path / "out.folded", tmp_path / "out", tmp_path / "err"
    for kill, word in ((False, "left running"), (True, "killed (--kill-on-exit)")):
        args = ["-c", "sleep 30", "--engine", engine, "--folded", str(folded), "0.2", "3"]
        with open(out, "w") as stdout, open(err, "w") as stderr:  # files: the command that runs on keeps them open
            status = subprocess.run(
                leaktrace_command(*args, *(["--kill-on-exit"] if kill else [])),
                stdout=stdout,
                stderr=stderr,
                timeout=60,
            ).returncode
        said = err.read_text()
        assert status == 0, said
        pid = int(said.split("command 'sleep 30' ", 1)[1].split()[0])
        assert f"command 'sleep 30' {pid} {word}" in said
        assert said.count(f"written to {folded}") == 1
        try:
            with open(f"/proc/{pid}/stat") as f:
                alive = f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            alive = False
        assert alive != kill
        if not kill:
            os.kill(pid, signal.SIGKILL)


def test_heap_of_a_static_program_gives_no_hint_heap_cannot_take(tmp_path):
    source, static = tmp_path / "sleeper.c", tmp_path / "sleeper"
    source.write_text("#include <unistd.h>\nint main(void) { for (;;) pause(); }\n")
    subprocess.run(["gcc", "-static", "-o", static, source], check=True)
    process = subprocess.Popen([static])
    try:
        result = run_command(["heap", "-p", str(process.pid)])
    finally:
        process.kill()
        process.wait()
    assert_one_line_error(result, 1, "the heap walk is glibc's")
    assert "--lib" not in result.stderr
