"""Real services traced by leaktrace and its peers, as ratios to their untraced speed.

    sudo .venv/bin/python bench/services.py [--rounds 3] [--only redis,db_bench,lxml]

- redis (Debian's redis-server, linked with jemalloc) and its own client, redis-benchmark
  (SET, GET, LPUSH, LPOP, -P 16), on 127.0.0.1: one server, started untraced, with each
  tool attached in turn (-p), and a fresh server under each tool that must launch it.
- db_bench (rocksdb-tools, C++, glibc's malloc): fillrandom, micros/op.
- python3 with lxml (a C extension): a parse and serialise loop, seconds.

Tools: untraced; leaktrace -p / -c (BPF); its probes with empty programs (the floor under
any uprobe tracer, bench/empty_probes.py); leaktrace --engine preload (-c, and -p: the library
put into the running server); memleak-bpfcc -p
(it cannot probe jemalloc, which lacks the mmap it also probes: a run where a tool died is
reported as failed, never as a figure; `memleak -c` attaches after its command starts, so
it is left out of the defaults); heaptrack. Sampled at 512 KiB: `preload -p --sample` and
`leaktrace -p --sample` (BPF), beside jemalloc's own profiler restarted with
`prof:true,lg_prof_sample:19` (`jemalloc prof`) and `empty probes`. Rounds are interleaved (each round runs every
tool once) and medians printed. An attached tool's runs are also paired with the untraced run
just before it on the same server ("paired": the median of those ratios); `untraced again`
(nothing attached) is that pairing's control.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).parent
PYTHON = sys.executable
LEAKTRACE = [PYTHON, "-m", "leaktrace.cli"]
REDIS_TESTS = ("SET", "GET", "LPUSH", "LPOP")
redis_tests = list(REDIS_TESTS)  # --redis-tests
LXML_SCRIPT = """
import sys, time
from lxml import etree
started = time.perf_counter()
for i in range(int(sys.argv[1])):
    root = etree.Element("root")
    for j in range(200):
        etree.SubElement(root, "item", id=str(j)).text = "x" * (j % 50)
    etree.fromstring(etree.tostring(root))
print(f"seconds {time.perf_counter() - started:.4f}")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(stream, pattern: str, timeout: float = 60) -> None:
    """Reads lines of a tool's output until one matches (the tool is live)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            raise RuntimeError(f"the tool ended before '{pattern}'")
        if re.search(pattern, line):
            return
    raise RuntimeError(f"no '{pattern}' within {timeout} s")


def stop(process: subprocess.Popen, sig: int = signal.SIGINT) -> None:
    if process.poll() is None:
        process.send_signal(sig)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


SETTLE_SECONDS = 2  # after a tool says it is attached, before the workload is timed

# Tools attached to a running process: argv (PID filled in) and the line that says it is live.
ATTACH = {
    "leaktrace -p": (LEAKTRACE + ["-p", "{pid}", "3600"], "stderr", "probes live"),
    "preload -p": (LEAKTRACE + ["--engine", "preload", "-p", "{pid}", "3600"], "stderr", "attached in-process"),
    # One frame per stack: what the stack walk costs, beside the two above (not in the defaults).
    "leaktrace -p --frames 1": (LEAKTRACE + ["-p", "{pid}", "--frames", "1", "3600"], "stderr", "probes live"),
    "preload -p --frames 1": (
        LEAKTRACE + ["--engine", "preload", "-p", "{pid}", "--frames", "1", "3600"],
        "stderr",
        "attached in-process",
    ),
    # Sampled by bytes at 512 KiB (Go's and jemalloc's rate): in-process, and decided in the kernel.
    "preload -p --sample": (
        LEAKTRACE + ["--engine", "preload", "-p", "{pid}", "--sample", "512KiB", "3600"],
        "stderr",
        "attached in-process",
    ),
    "leaktrace -p --sample": (LEAKTRACE + ["-p", "{pid}", "--sample", "512KiB", "3600"], "stderr", "probes live"),
    "empty probes": ([PYTHON, str(HERE / "empty_probes.py"), "-p", "{pid}"], "stdout", "attached"),
    "memleak -p": (["memleak-bpfcc", "-O", "{library}", "-p", "{pid}", "3600"], "stdout", "Attaching to pid"),
}
# Tools that start the workload: a prefix of its argv.
LAUNCH = {
    "leaktrace -c": LEAKTRACE + ["--engine", "bpf", "3600", "-c"],
    "preload -c": LEAKTRACE + ["--engine", "preload", "3600", "-c"],
    "empty probes": [PYTHON, str(HERE / "empty_probes.py")],
    "memleak -c": ["memleak-bpfcc", "-O", "{library}", "3600", "-c"],
    "heaptrack": ["heaptrack", "-o", "{out}/heaptrack"],
    # A fresh untraced service, as the launching tools start one: their baseline beside "untraced".
    "restarted": ["env"],
    # jemalloc's own sampling profiler (Debian's has prof compiled in), restarted with it: the anchor.
    "jemalloc prof": ["env", "MALLOC_CONF=prof:true,lg_prof_sample:19"],
}
ONE_STRING = {"leaktrace -c", "preload -c", "memleak -c"}  # they take the command as one string


def allocator_of(program: str) -> str:
    """The allocator library a program calls (memleak probes libc's unless told: -O)."""
    from leaktrace.platform.process import library_of_executable, resolve_executable

    return library_of_executable(resolve_executable(program))


def attached(tool: str, pid: int) -> subprocess.Popen:
    argv, stream, ready = ATTACH[tool]
    library = allocator_of(os.readlink(f"/proc/{pid}/exe"))
    process = subprocess.Popen(
        [part.format(pid=pid, library=library) for part in argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(process.stdout if stream == "stdout" else process.stderr, ready)
    # The steady state, not the attach: memleak's probes go in after its line, and the first
    # second after an in-process attach pays for the library's first pages and threads.
    time.sleep(SETTLE_SECONDS)
    return process


def launched(tool: str | None, argv: list[str], out: str, **popen) -> subprocess.Popen:
    """argv started under tool (None: untraced)."""
    if tool is None:
        return subprocess.Popen(argv, **popen)
    prefix = [part.format(out=out, library=allocator_of(argv[0])) for part in LAUNCH[tool]]
    command = prefix + ([" ".join(argv)] if tool in ONE_STRING else argv)
    return subprocess.Popen(command, **popen)


def redis_benchmark(port: int, requests: int) -> dict[str, float]:
    result = subprocess.run(
        ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-q", "-P", "16", "-n", str(requests)]
        + ["-t", ",".join(test.lower() for test in redis_tests), "--csv"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return {row["test"]: float(row["rps"]) for row in csv.DictReader(result.stdout.splitlines())}


def redis_round(tools: list[str], requests: int, out: str, results: dict, paired: dict) -> None:
    """Every tool once: attached to one untraced server, or launching its own. paired gets each
    tool's figure over the untraced run just before it (one machine's slow spell falls on both)."""
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""], **QUIET)
    baseline: dict[str, float] = {}
    try:
        await_port(port)
        for tool in tools:
            if tool in ("untraced", "untraced again"):  # the second: the control, nothing attached
                found = redis_benchmark(port, requests)
            elif tool in ATTACH:
                process = attached(tool, server.pid)
                try:
                    found = redis_benchmark(port, requests)
                    if process.poll() is not None:  # it died meanwhile: the figure is an untraced one
                        raise RuntimeError(f"{tool} ended during the run: {process.stderr.read()[-300:]!r}")
                finally:
                    stop(process)
            else:
                found = redis_launched(tool, requests, out)
            for test, rps in found.items():
                results[f"redis {test}"][tool].append(rps)
                if tool == "untraced":
                    baseline[test] = rps
                elif test in baseline:
                    paired[f"redis {test}"][tool].append(rps / baseline[test])
    finally:
        stop(server, signal.SIGTERM)


def redis_launched(tool: str, requests: int, out: str) -> dict[str, float]:
    port = free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "''"]
    server = launched(tool, argv, out, **QUIET)
    try:
        await_port(port, server)
        return redis_benchmark(port, requests)
    finally:
        kill_children(server)
        stop(server, signal.SIGTERM)


def kill_children(process: subprocess.Popen) -> None:
    """SIGTERM to the service a tool launched (its child), so the tool ends as it does when its command does."""
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
    try:
        pids = [int(pid) for pid in children.read_text().split()]
    except OSError:
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    time.sleep(1)


def await_port(port: int, process: subprocess.Popen | None = None, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the service ended with status {process.returncode} before it listened")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port}")


def timed_command(tool: str, argv: list[str], out: str, pattern: str) -> float:
    """The figure a workload prints (pattern's group 1), run under tool; the tool is stopped
    once the figure is out (memleak -c goes on after its command ends)."""
    process = launched(
        None if tool == "untraced" else tool, argv, out, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    found = None
    try:
        for line in process.stdout:
            found = found or re.search(pattern, line)
            if found:
                break
    finally:
        stop(process)
    if not found:
        raise RuntimeError(f"{tool}: status {process.returncode}, no figure from {argv[0]}")
    return float(found.group(1))


def command_round(tools: list[str], out: str, results: dict, only: set[str], scale: int) -> None:
    if "db_bench" in only:
        db = tempfile.mkdtemp(dir=out)
        argv = ["db_bench", "--benchmarks=fillrandom", f"--num={100_000 * scale}", f"--db={db}"]
        for tool in tools:
            if (tool not in ATTACH or tool == "empty probes") and tool != "untraced again":
                shutil.rmtree(db, ignore_errors=True)
                results["db_bench fillrandom (ops/s)"][tool].append(
                    1e6 / timed_command(tool, argv, out, r"fillrandom\s*:\s*([\d.]+) micros/op")
                )
    if "lxml" in only:
        script = Path(out, "lxml_loop.py")
        script.write_text(LXML_SCRIPT)
        argv = ["/usr/bin/python3", str(script), str(200 * scale)]
        for tool in tools:
            if (tool not in ATTACH or tool == "empty probes") and tool != "untraced again":
                results["python3 lxml (loops/s)"][tool].append(
                    200 * scale / timed_command(tool, argv, out, r"seconds ([\d.]+)")
                )


QUIET = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200_000, help="redis-benchmark requests per test")
    parser.add_argument("--scale", type=int, default=1, help="db_bench and lxml work, in units")
    parser.add_argument("--only", default="redis,db_bench,lxml")
    parser.add_argument("--redis-tests", default=",".join(REDIS_TESTS), help="redis-benchmark's tests, by name")
    parser.add_argument(
        "--tools",
        default="untraced,leaktrace -p,preload -p,empty probes,memleak -p,leaktrace -c,preload -c,heaptrack",
    )
    args = parser.parse_args()
    redis_tests[:] = args.redis_tests.upper().split(",")
    tools = args.tools.split(",")
    only = set(args.only.split(","))
    results: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    paired: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    failures: dict[tuple[str, str], str] = {}
    with tempfile.TemporaryDirectory() as out:
        for round_number in range(args.rounds):
            print(f"round {round_number + 1} of {args.rounds}", file=sys.stderr, flush=True)
            for tool in tools:  # one tool failing (e.g. a crash of the service under it) is reported, not fatal
                try:
                    if "redis" in only:
                        redis_round(
                            ["untraced", tool] if tool != "untraced" else [tool], args.requests, out, results, paired
                        )
                    command_round(["untraced", tool] if tool != "untraced" else [tool], out, results, only, args.scale)
                except (RuntimeError, subprocess.SubprocessError, OSError) as e:
                    failures[(tool, str(e)[:120])] = str(e)
    print_results(results, paired, failures)


def print_results(results: dict, paired: dict, failures: dict) -> None:
    for workload, by_tool in results.items():
        base = statistics.median(by_tool["untraced"]) if by_tool.get("untraced") else None
        print(f"\n{workload}: median of {len(by_tool.get('untraced', []))} untraced runs, others per tool")
        for tool, values in by_tool.items():
            if not values:
                continue
            median = statistics.median(values)
            ratio = f"{median / base:8.4f} of untraced" if base else ""
            ratios = paired.get(workload, {}).get(tool)
            beside = f", {statistics.median(ratios):.4f} paired" if ratios else ""
            print(f"  {tool:14} {median:14,.0f} {ratio}{beside}   ({len(values)} runs)")
    for tool, why in failures:
        print(f"failed: {tool}: {why}")


if __name__ == "__main__":
    main()
