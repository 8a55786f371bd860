"""-p PID --engine preload on a process started without the library: leaktrace puts it in
(a remote dlopen through ptrace, the malloc family's GOT slots patched), counts exactly from
then on, and takes the hooks out when it ends, or when it is killed; under CPU hogs, with
the target allocating from several threads all along."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest

from conftest import leaktrace_command
from helpers import (
    SLOWDOWN,
    TIMEOUT,
    free_port,
    library_hooked,
    preload_attached,
    preload_tracing,
    trace_ended,
    wait_for_line,
    wait_for_redis,
)

pytestmark = pytest.mark.usefixtures("cpu_hogs")


@pytest.fixture
def target(program):
    process = subprocess.Popen([program("attach_target")], stdout=subprocess.PIPE, text=True)
    assert wait_for_line(process.stdout) == "ready\n"
    yield process
    process.kill()
    process.wait()


def test_counts_from_the_attach_on_are_exact_and_the_hooks_come_out_at_the_end(target):
    tracer = preload_attached(target.pid)
    assert library_hooked(target.pid)
    target.send_signal(signal.SIGUSR1)
    assert wait_for_line(target.stdout) == "done\n"
    report = trace_ended(tracer)
    by_size = {group["size"]: group for group in report["groups"] if group["size"] in (100, 101, 102, 103, 3000, 5000)}
    for i in range(4):
        group = by_size[100 + i]
        assert group["count"] == 50, group
        assert [frame["function"] for frame in group["frames"][:1]] == ["keep"]
    assert by_size[3000]["count"] == 7 and by_size[3000]["frames"][0]["function"] == "main"
    assert by_size[5000]["count"] == 1
    assert sum(g["count"] for g in report["groups"] if g["size"] in (100, 101, 102, 103, 3000, 5000, 2000, 10)) == 208
    # The ten blocks from before the attach were freed after it: passed through, counted.
    assert report["counters"]["unknown_frees"] >= 10
    assert report["counters"]["live_map_full"] == 0 and report["counters"]["pending_lost"] == 0
    assert not library_hooked(target.pid)
    # What the library recorded goes back to the allocator without it.
    target.send_signal(signal.SIGUSR2)
    assert wait_for_line(target.stdout) == "freed\n"
    again = preload_attached(target.pid)
    assert library_hooked(target.pid)
    report = trace_ended(again)
    assert report["counters"]["allocations"] > 0
    assert not library_hooked(target.pid) and target.poll() is None


def test_unreachable_blocks_from_before_and_after_the_attach_are_found(target):
    """--unreachable on a process the library was put into: the block lost before the attach
    comes from the heap walk (no stack), the one lost after it with its stack; the kept ones
    and the library's own arrays are not leaks."""
    tracer = preload_tracing(target.pid, "--unreachable")
    assert "attached in-process" in wait_for_line(tracer.stderr)
    target.send_signal(signal.SIGUSR1)
    assert wait_for_line(target.stdout) == "done\n"
    unreachable = trace_ended(tracer)["unreachable"]
    assert unreachable["heap_walk"].startswith("heap walk (glibc")
    leaks = unreachable["leaks"]
    assert [leak["stack_status"] for leak in leaks if 777 <= leak["size"] <= 800] == ["before_trace"]
    after = [leak for leak in leaks if leak["size"] == 888]
    assert len(after) == 1 and after[0]["frames"][0]["function"] == "lose"
    assert unreachable["num_leaks"] == 2, leaks


def test_the_hooks_come_out_when_leaktrace_is_killed(target):
    tracer = preload_attached(target.pid)
    assert library_hooked(target.pid)
    tracer.kill()
    tracer.wait()
    time.sleep(0.2)  # the library's watcher looks every 20 ms
    assert not library_hooked(target.pid) and target.poll() is None


def test_a_static_program_and_a_traced_one_are_refused_in_one_line(program, build_dir):
    static = build_dir / "static_sleeper"
    source = build_dir / "static_sleeper.c"
    source.write_text("#include <unistd.h>\nint main(void) { for (;;) pause(); }\n")
    subprocess.run(["gcc", "-static", "-o", static, source], check=True)
    cases = [
        (subprocess.Popen([static]), "is a static program: the in-process library cannot interpose calls"),
        (
            subprocess.Popen(
                ["strace", "-f", "-o", "/dev/null", str(program("attach_target"))], stdout=subprocess.PIPE
            ),
            "is traced by pid",
        ),
    ]
    traced = 0
    try:
        time.sleep(0.5)
        for process, why in cases:
            pid = process.pid
            if why == "is traced by pid":  # the traced program is strace's child
                pid = traced = int(subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout)
            result = subprocess.run(
                leaktrace_command("-p", str(pid), "--engine", "preload", "1", "1"), capture_output=True, text=True
            )
            assert result.returncode == 1, result.stderr
            assert result.stderr.count("\n") == 1 and why in result.stderr, result.stderr
    finally:
        if traced:
            os.kill(traced, signal.SIGKILL)  # strace's child: killing strace lets it run on
        for process, _ in cases:
            process.kill()
            process.wait()


def test_redis_with_jemalloc_attached_and_detached_keeps_serving(tmp_path):
    """Debian's redis-server (jemalloc): attached while it serves, its blocks go to jemalloc
    and back; after the detach it serves on."""
    port = free_port()
    log = open(tmp_path / "redis.log", "w")
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=log,
        stderr=log,
    )
    cli = ["redis-cli", "-p", str(port)]
    try:
        wait_for_redis(port, lambda: server.poll() is None, timeout=20)
        tracer = preload_attached(server.pid)
        for i in range(200):
            subprocess.run([*cli, "SET", f"key{i}", "v" * 1000], check=True, capture_output=True)
        report = trace_ended(tracer)
        assert report["counters"]["allocations"] > 200
        thousand = [g for g in report["groups"] if 1000 <= g["size"] <= 1100]
        assert sum(g["count"] for g in thousand) >= 200, "each value's block is seen"
        assert subprocess.run([*cli, "GET", "key7"], capture_output=True, text=True).stdout.strip() == "v" * 1000
        for i in range(200):
            subprocess.run([*cli, "DEL", f"key{i}"], check=True, capture_output=True)
        assert subprocess.run([*cli, "PING"], capture_output=True, text=True).stdout.strip() == "PONG"
        assert server.poll() is None
    finally:
        server.kill()
        server.wait()
        log.close()


SEED = int(os.environ.get("LEAKTRACE_FAULT_SEED", str(time.time_ns() % 1_000_000_007)))


def test_leaktrace_stopped_at_any_moment_of_the_attach_leaves_the_process_unhooked(target):
    """SIGTERM to leaktrace 0-300 ms after it starts, ten times on one process: leaktrace
    ends without a traceback, and the process runs on with no hook left."""
    print(f"LEAKTRACE_FAULT_SEED={SEED}")
    chooser = random.Random(SEED)
    for _ in range(10):
        tracer = preload_tracing(target.pid)
        time.sleep(chooser.uniform(0, 0.3))
        tracer.send_signal(signal.SIGTERM)
        _, err = tracer.communicate(timeout=30)
        assert "Traceback" not in err
        assert target.poll() is None
        assert not library_hooked(target.pid)


def test_a_process_killed_at_any_moment_of_the_attach_ends_leaktrace_in_one_line(program):
    print(f"LEAKTRACE_FAULT_SEED={SEED}")
    chooser = random.Random(SEED)
    for _ in range(10):
        process = subprocess.Popen([program("attach_target")], stdout=subprocess.PIPE, text=True)
        assert wait_for_line(process.stdout) == "ready\n"
        tracer = preload_tracing(process.pid)
        time.sleep(chooser.uniform(0, 0.5))
        process.kill()
        process.wait()
        _, err = tracer.communicate(timeout=30)
        assert "Traceback" not in err, err
        assert tracer.returncode in (0, 1), err


CTYPES_FIRST = """import ctypes, sys
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
print("ready", flush=True)
sys.stdin.readline()
kept = [libc.malloc(77777) for _ in range(3)]
print("done", flush=True)
sys.stdin.readline()
"""


def test_ctypes_loaded_before_the_attach_is_said_once(target):
    """A ctypes function looked up before the attach is called through its pointer, which the
    attach cannot hook: one line says so where ctypes is loaded, and none where it is not."""
    script = subprocess.Popen(["python3", "-c", CTYPES_FIRST], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert wait_for_line(script.stdout) == "ready\n"
        tracer = preload_attached(script.pid)
        script.stdin.write("go\n")
        script.stdin.flush()
        assert wait_for_line(script.stdout) == "done\n"
        tracer.send_signal(signal.SIGINT)
        _, err = tracer.communicate(timeout=120)
        assert tracer.returncode == 0, err
        said = [line for line in err.splitlines() if "ctypes loaded" in line]
        assert said == [
            f"leaktrace: pid {script.pid} has ctypes loaded: a C function it looked up before the attach "
            "(ctypes.CDLL(None).malloc) is called through its pointer, and those calls are not seen "
            "(the BPF engine sees them)"
        ], err
    finally:
        script.kill()
        script.wait()
    plain = preload_attached(target.pid)
    plain.send_signal(signal.SIGINT)
    _, err = plain.communicate(timeout=120)
    assert plain.returncode == 0 and "ctypes" not in err, err


@pytest.mark.parametrize("kind", ["read", "epoll", "poll", "sigwait", "condwait", "sleep"])
def test_a_thread_held_for_the_attach_goes_on_waiting_as_if_never_woken(kind, program):
    """The attach and the detach each hold the program's only thread (condwait: its first of two)
    where it waits: the wait is run on afterwards, never ended with EINTR (the kernel ends
    epoll's and sigtimedwait's so), and a sleep is not begun anew (it would end past its time)."""
    pause, asked = 1.0 * SLOWDOWN, 8.0 * SLOWDOWN
    with subprocess.Popen(
        [program("waits"), kind, str(asked)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as process:
        try:
            assert wait_for_line(process.stdout) == "ready\n"
            time.sleep(pause)  # the sleep is this far along at the first hold
            trace_ended(preload_attached(process.pid))
            if kind == "sigwait":
                process.send_signal(signal.SIGUSR1)
            elif kind != "sleep":
                process.stdin.write("x")
                process.stdin.flush()
            out, _ = process.communicate(timeout=TIMEOUT)
        finally:
            process.kill()
    assert process.returncode == 0, out
    if kind == "sleep":
        slept = float(out.split()[1])
        assert asked <= slept < asked + pause / 2, out
