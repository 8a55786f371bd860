"""Systemwide tracing under load: N processes allocating at once (bench/alloc_bench.c,
1% leaked), untraced and under `leaktrace --all`, interleaved over several rounds.
Prints the median slowdown, what leaktrace itself holds (its peak RSS and the kernel
memory of its BPF maps, from /proc/PID/fdinfo), the live allocations it ended with,
its drop counters and how long its reports took. Run as root from the repo:

    .venv/bin/python bench/system_bench.py [--processes 24] [--calls 200000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from run_bench import build, ns_per_call  # noqa: E402  (the bench scripts share the workload)

START_DELAY_MS = 300


def run_workloads(binary: Path, processes: int, calls: int) -> float:
    """Starts every workload at once; the median over them of ns per call."""
    argv = [str(binary), "1", str(calls), "10", str(START_DELAY_MS)]
    running = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    return statistics.median(ns_per_call(p.communicate()[0]) for p in running)


def bpf_map_bytes(pid: int) -> int:
    """Kernel memory of the BPF maps a process holds open (fdinfo's memlock)."""
    total = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:bpf-map":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        total += int(fields.get("memlock", "0").strip())
    return total


def rss(pid: int, field: str = "VmRSS") -> int:
    """Resident memory of a process (VmRSS), or its peak (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def traced_round(binary: Path, args: argparse.Namespace) -> dict:
    tool = subprocess.Popen(
        [sys.executable, "-m", "leaktrace.cli", "--all", "--json", str(args.interval)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = tool.stderr.readline()
    if "probes live" not in line:
        raise RuntimeError(line + tool.stderr.read())
    at_start = rss(tool.pid)
    ns = run_workloads(binary, args.processes, args.calls)
    time.sleep(args.interval * 2)  # a report with every workload in it, exited
    memory = {
        "rss_start": at_start,
        "rss_peak": rss(tool.pid, "VmHWM"),
        "rss_end": rss(tool.pid),
        "maps": bpf_map_bytes(tool.pid),
    }
    tool.send_signal(signal.SIGINT)
    out, err = tool.communicate(timeout=600)
    try:
        reports = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    except ValueError:
        Path("/tmp/system_bench_out.txt").write_text(out)
        raise
    most = max(reports, key=lambda r: r["live_allocations"])
    return {
        "ns": ns,
        **memory,
        "reports": len(reports),
        "live": most["live_allocations"],
        "processes": max(len(r["processes"]) for r in reports),
        "counters": reports[-1]["counters"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=24)
    parser.add_argument("--calls", type=int, default=200_000, help="malloc/free pairs per process")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval", type=float, default=1.0, help="leaktrace's report interval")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        binary = build(Path(tmp))["alloc_bench"]
        untraced, traced = [], []
        for round_number in range(args.rounds):
            untraced.append(run_workloads(binary, args.processes, args.calls))
            traced.append(traced_round(binary, args))
            print(
                f"round {round_number + 1}: untraced {untraced[-1]:.1f} ns/call, "
                f"leaktrace --all {traced[-1]['ns']:.1f} ns/call",
                flush=True,
            )
    last = traced[-1]
    base, under = statistics.median(untraced), statistics.median(t["ns"] for t in traced)
    drops = {
        name: value
        for name, value in last["counters"].items()
        if value and name not in ("allocations", "frees", "internal_frees", "nested_calls")
    }
    print(f"{args.processes} processes x {args.calls} malloc/free pairs (1% leaked), {args.rounds} rounds:")
    print(
        f"  per call, median of processes and rounds: untraced {base:.1f} ns, under leaktrace --all "
        f"{under:.1f} ns ({under / base:.0f}x)"
    )
    mib = {key: last[key] / 2**20 for key in ("rss_start", "rss_peak", "rss_end", "maps")}
    print(
        f"  leaktrace itself: RSS {mib['rss_start']:.0f} MiB once probes were live (bcc and LLVM), "
        f"{mib['rss_end']:.0f} MiB at the end, peak {mib['rss_peak']:.0f} MiB; "
        f"BPF maps {mib['maps']:.0f} MiB (fdinfo memlock)"
    )
    print(
        f"  largest report: {last['live']} live allocations in {last['processes']} processes; "
        f"{last['reports']} reports; allocations {last['counters']['allocations']}, "
        f"frees {last['counters']['frees']}; drops {drops or 'none'}"
    )


if __name__ == "__main__":
    main()
