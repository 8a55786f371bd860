"""Running leaktrace for real and reading its JSON reports."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import jsonschema
from each import each

from conftest import leaktrace_command

# Timeouts stretch by this factor where everything runs slower: scripts/vm.sh sets it under
# TCG, which emulates every instruction.
SLOWDOWN = float(os.environ.get("LEAKTRACE_TEST_SLOWDOWN") or 1)
TIMEOUT = 120 * SLOWDOWN
REPORT_SCHEMA = jsonschema.Draft202012Validator(
    json.loads((Path(__file__).parents[2] / "docs" / "report.schema.json").read_text())
)
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def library_env(options: str) -> dict[str, str]:
    """The environment of a program run with leaktrace's preload library, told options."""
    from leaktrace.sources.preload.trace import preload_library

    return {"LD_PRELOAD": preload_library(), "LIBC_DEBUG_MALLOC_OPTIONS": options}


def run_with_library(argv: list[str], options: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, env=library_env(options))


def reports(stdout: str) -> list[dict]:
    """The JSON reports in a trace's output, each checked against docs/report.schema.json."""
    found = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    for report in found:
        if "groups" in report:  # a trace's report (heap -p --json has its own shape)
            REPORT_SCHEMA.validate(report)
    return found


def sites(report: dict) -> dict[str, list[tuple[int, int]]]:
    """Innermost function (or "(filtered)"/"(lost)") -> sorted [(size, count)]."""
    table: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for group in report["groups"]:
        if group["stack_status"] == "captured":
            key = group["frames"][0]["function"] or hex(group["frames"][0]["address"])
        else:
            key = f"({group['stack_status']})"
        table[key].append((group["size"], group["count"]))
    return {key: sorted(value) for key, value in table.items()}


def run_command(
    args: list[str], timeout: float = TIMEOUT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """leaktrace ARGS to completion (for -c, the command's exit ends it)."""
    return subprocess.run(leaktrace_command(*args), capture_output=True, text=True, timeout=timeout, env=env)


def final_report(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    found = reports(result.stdout)
    assert found, f"no report in {result.stdout!r} / {result.stderr!r}"
    for report in found:  # every truncated stack has its one reason
        counters = report["counters"]
        reasons = sum(value for name, value in counters.items() if name.startswith("stacks_truncated_"))
        assert reasons == counters["stacks_truncated"], counters
    return found[-1]


def wait_for_line(stream, timeout: float = TIMEOUT) -> str:
    ready, _, _ = select.select([stream], [], [], timeout)
    assert ready, "timed out waiting for output"
    return stream.readline()


def wait_for_start(stream, timeout: float = TIMEOUT) -> str:
    """leaktrace's first line on stream past the one naming kernel features that are off (an
    older kernel's: a test VM's)."""
    line = wait_for_line(stream, timeout)
    while line.startswith("leaktrace: on Linux "):
        # Printed at once after it, maybe into the stream's buffer already, where select cannot see it.
        line = stream.readline()
    return line


class AttachedTrace:
    """leaktrace -p PID running against a process, ended with a signal."""

    def __init__(self, pid: int, *args: str):
        self.process = subprocess.Popen(
            leaktrace_command("-p", str(pid), "--json", *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.start_line = wait_for_start(self.process.stderr)
        if "probes live" not in line and "attached in-process" not in line:
            self.process.kill()  # else the read below waits for a trace that never ends
            raise AssertionError(line + self.process.stderr.read())

    def stop(self, sig: int = signal.SIGINT) -> tuple[int, str, str]:
        self.process.send_signal(sig)
        out, err = self.process.communicate(timeout=TIMEOUT)
        return self.process.returncode, out, err


def chromium(url: str, *what: str, budget_ms: int = 3000) -> str:
    """Chromium headless on a local page, offline, given budget_ms of virtual time for the
    page's timers to run."""
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                f"--virtual-time-budget={budget_ms}",
                "--window-size=1280,900",
                "--proxy-server=127.0.0.1:9",
                *what,
                url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


GO = shutil.which("go") or "/usr/bin/go"


def pprof_top(path, sample_index: str, tmp_path) -> dict[str, int]:
    """go tool pprof -top: flat value per function (bytes in B, or a count); no node dropped as small."""
    result = subprocess.run(
        [
            GO,
            "tool",
            "pprof",
            "-top",
            "-nodecount=1000",
            "-nodefraction=0",
            "-unit=B",
            f"-sample_index={sample_index}",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(tmp_path), "PPROF_TMPDIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    flat = {}
    for line in result.stdout.splitlines():
        row = re.match(r"\s*(\d+)B?\s+[\d.]+%\s+[\d.]+%\s+\S+\s+[\d.]+%\s+(.+)$", line)
        if row and int(row.group(1)):
            flat[row.group(2).strip()] = int(row.group(1))
    return flat


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_redis(port: int, running, timeout: float = 30) -> None:
    """Until the redis on port answers PING; running() says whatever starts it is still there."""
    deadline = time.monotonic() + timeout
    while (
        subprocess.run(["redis-cli", "-p", str(port), "PING"], capture_output=True, text=True, timeout=30).stdout
        != "PONG\n"
    ):
        assert time.monotonic() < deadline and running(), "redis did not start"
        time.sleep(0.05)


@contextlib.contextmanager
def prometheus_scraping(target: str, tmp_path, interval: str = "1s"):
    """Debian's Prometheus on 127.0.0.1 scraping target (HOST:PORT); yields its query URL."""
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: {interval}\nscrape_configs:\n  - job_name: leaktrace\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
    )
    prometheus = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"http://127.0.0.1:{port}/api/v1/query"
    finally:
        prometheus.terminate()
        prometheus.wait()


def preload_tracing(pid: int, *extra: str) -> subprocess.Popen:
    """leaktrace -p PID --engine preload --json (and extra options), just started."""
    return subprocess.Popen(
        leaktrace_command("-p", str(pid), "--engine", "preload", "--json", *extra, "3600"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def preload_attached(pid: int) -> subprocess.Popen:
    """leaktrace -p PID --engine preload, once it says the library is in."""
    tracer = preload_tracing(pid)
    line = wait_for_line(tracer.stderr)
    assert "attached in-process" in line, line + tracer.stderr.read()
    return tracer


def trace_ended(tracer: subprocess.Popen) -> dict:
    """The last report of a trace ended with SIGINT, which must end it well."""
    tracer.send_signal(signal.SIGINT)
    out, err = tracer.communicate(timeout=TIMEOUT)
    assert tracer.returncode == 0 and "Traceback" not in err, err
    return reports(out)[-1]


def library_hooked(pid: int) -> bool:
    """The in-process library sees the program's calls: its counters move while it runs."""
    from leaktrace.platform.process import parse_maps, read_target
    from leaktrace.sources.preload.table import counters_in_place, library_base

    if library_base(pid, parse_maps(read_target(pid).maps)) is None:
        return False  # never put in
    before = counters_in_place(pid).allocations
    time.sleep(0.3)
    return counters_in_place(pid).allocations != before


def attach_target_traced(argv: list[str], pid_of=lambda target: target.pid, *options: str) -> tuple[dict, str]:
    """attach_target (argv runs it; pid_of: its pid as this machine sees it), its threads
    allocating all along, traced (by the BPF engine, unless options say) from its "ready":
    what SIGUSR1 keeps is exact. The final report, and the trace's start line."""
    target = subprocess.Popen(argv, stdout=subprocess.PIPE)
    try:
        assert wait_for_line(target.stdout) == b"ready\n"
        pid = pid_of(target)
        trace = AttachedTrace(pid, *options, "3600")
        os.kill(pid, signal.SIGUSR1)
        assert wait_for_line(target.stdout) == b"done\n"
        status, out, err = trace.stop()
        assert target.poll() is None
    finally:
        target.kill()
        target.wait(timeout=TIMEOUT)
    report = final_report(subprocess.CompletedProcess([], status, out, err))
    kept = sites(report)
    assert kept.get("keep") == [(100, 50), (101, 50), (102, 50), (103, 50)], kept
    assert (3000, 7) in kept.get("main", []), kept
    return report, trace.start_line


def fake_python_traced(fake: Path, *options: str) -> subprocess.CompletedProcess:
    """leaktrace -c on a build of fake_python (a CPython the walk is not to walk): it ends
    well, and its 100 blocks of 4321 bytes are exact, with native frames only, from make."""
    result = run_command(["-c", str(fake), *options, "--json", "3600"])
    assert result.returncode == 0 and "done" in result.stdout, result.stderr
    made = [g for g in final_report(result)["groups"] if g["size"] == 4321]
    assert sum(g["count"] for g in made) == 100, made
    assert (
        all(f["kind"] == "native" for g in each(made) for f in g["frames"])
        and made[0]["frames"][0]["function"] == "make"
    )
    return result
