"""`leaktrace --all` under process churn: short processes (each execs, makes four blocks and
exits) started as fast as a churn program can for SECONDS, untraced and then under
`leaktrace --all INTERVAL --json`. Prints the processes per second sustained each way,
leaktrace's CPU (share of one core, from /proc/PID/stat), its RSS, the largest gap
between two reports against the interval asked for, how long SIGTERM took to end it, and
its drop counters. Run as root from the repo:

    .venv/bin/python bench/churn_bench.py [--seconds 30] [--parallel 4] [--interval 5]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).parent
TICKS = os.sysconf("SC_CLK_TCK")


def churn(binary: Path, seconds: float, parallel: int) -> float:
    """Processes per second the churn program sustained."""
    result = subprocess.run([str(binary), str(seconds), str(parallel)], capture_output=True, text=True, check=True)
    _, processes, _, elapsed = result.stdout.split()
    return int(processes) / (int(elapsed) / 1e9)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--interval", type=float, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        binary = Path(out) / "churn"
        subprocess.run(["gcc", "-O2", "-o", str(binary), str(HERE / "churn.c")], check=True)
        untraced = churn(binary, args.seconds, args.parallel)
        trace = subprocess.Popen(
            [sys.executable, "-m", "leaktrace.cli", "--all", str(args.interval), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert "probes live" in trace.stderr.readline()
        reports: list[tuple[float, dict]] = []
        reader = threading.Thread(
            target=lambda: reports.extend((time.monotonic(), json.loads(line)) for line in trace.stdout), daemon=True
        )
        reader.start()
        started, cpu_before = time.monotonic(), cpu_seconds(trace.pid)
        traced = churn(binary, args.seconds, args.parallel)
        busy = (cpu_seconds(trace.pid) - cpu_before) / (time.monotonic() - started)
        rss = rss_mib(trace.pid)
        time.sleep(args.interval)  # one report after the churn
        stopping = time.monotonic()
        trace.send_signal(signal.SIGTERM)
        trace.wait(timeout=600)
        stop_s = time.monotonic() - stopping
        reader.join()
    times = [started] + [at for at, _ in reports]
    gap = max(b - a for a, b in zip(times, times[1:])) if len(times) > 1 else float("nan")
    last = reports[-1][1] if reports else {}
    drops = {
        name: value
        for name, value in last.get("counters", {}).items()
        if value and name not in ("allocations", "frees")
    }
    print(
        f"churn: {untraced:.0f} processes/s untraced, {traced:.0f} under leaktrace --all "
        f"({args.parallel} at a time, {args.seconds:g} s)"
    )
    print(
        f"leaktrace: {busy * 100:.0f}% of a core during the churn, RSS {rss:.0f} MiB, "
        f"{len(reports)} reports, largest gap {gap:.1f} s (interval {args.interval:g} s), "
        f"SIGTERM to exit {stop_s:.2f} s"
    )
    print(
        f"last report: {last.get('live_allocations')} live allocations in {len(last.get('processes', []))} "
        f"processes; allocations {last.get('counters', {}).get('allocations')}; drops {drops}"
    )


if __name__ == "__main__":
    main()
