"""One run, several interleaved rounds: the traced/untraced slowdown of leaktrace (BPF
engine, and the LD_PRELOAD library with and without stacks), of its probes with empty
programs (the traps alone) and of bcc's memleak-bpfcc on the same workload, for one and
two threads; both tools' start-up and shutdown; then leaktrace's report time at 100k and
1M live allocations; and the same mix 16 calls deep in a build without frame pointers
(DWARF stacks against the frame-pointer walk, the floor and memleak); the unwind tables'
build, cold and cached. Prints medians and ratios; run as root from the repo:

    .venv/bin/python bench/run_bench.py [--rounds 3] [--threads 1 2] [--calls 100000]
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from leaktrace import BpfTrace, EngineSettings, Symbolizer, render_text

HERE = Path(__file__).parent
START_DELAY_MS = 2500  # lets memleak, which attaches after starting the command, get ready
DEEP = 16  # the deep workload's calls below each thread's start routine


def build(out: Path) -> dict[str, Path]:
    built = {}
    for name in ("alloc_bench", "hold", "probe_watch"):
        built[name] = out / name
        subprocess.run(
            ["gcc", "-O2", "-fno-omit-frame-pointer", "-pthread", "-o", str(built[name]), str(HERE / f"{name}.c")],
            check=True,
        )
    # The deep workload as distributions build it: no frame pointers.
    built["alloc_bench_nofp"] = out / "alloc_bench_nofp"
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-fomit-frame-pointer",
            "-pthread",
            "-o",
            str(built["alloc_bench_nofp"]),
            str(HERE / "alloc_bench.c"),
        ],
        check=True,
    )
    return built


def ns_per_call(output: str) -> float:
    for line in output.splitlines():
        if line.startswith("calls "):
            _, calls, _, elapsed = line.split()
            return int(elapsed) / int(calls)
    raise RuntimeError(f"no timing line in output:\n{output[-2000:]}")


def run(argv: list[str]) -> float:
    """Runs a workload (maybe under a tracer) until it prints its timing line. A tracer that
    failed (did not attach, died) is an error, never a figure."""
    tool = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in tool.stdout:
        seen.append(line)
        if line.startswith("calls "):
            break
    # memleak keeps running after its command exits: stop it once the timing is in.
    tool.send_signal(signal.SIGINT)
    _, errors = tool.communicate(timeout=300)
    failed = tool.returncode not in (0, 130, -signal.SIGINT) or "Traceback" in errors or "Failed to attach" in errors
    if failed or ("memleak" in argv[0] and not any(line.startswith("Attaching to pid") for line in seen)):
        raise RuntimeError(f"{' '.join(argv)} failed (exit status {tool.returncode}): {errors[-2000:]}")
    return ns_per_call("".join(seen))


def interleaved(tools: dict[str, list[str]], workload: str, rounds: int, memleak: bool = True) -> dict[str, float]:
    """Median ns per call of each tool (and memleak-bpfcc, if installed and asked for), rounds interleaved."""
    found = shutil.which("memleak-bpfcc") if memleak else None
    if found:
        tools["memleak-bpfcc"] = [found, "-c", workload, "3600"]
    samples: dict[str, list[float]] = {name: [] for name in tools}
    for _ in range(rounds):
        for name, argv in tools.items():
            samples[name].append(run(argv))
    return {name: statistics.median(values) for name, values in samples.items()}


def print_medians(title: str, medians: dict[str, float]) -> None:
    """Each tool's median and its slowdown against the "untraced" one."""
    print(title)
    print(f"{'':26}{'ns/call (median)':>18}{'slowdown':>10}")
    for name, median in medians.items():
        print(f"{name:26}{median:18.1f}{median / medians['untraced']:9.1f}x")


def print_table(title: str, medians: dict[str, float], leaktrace: str) -> None:
    print_medians(title, medians)
    if "memleak-bpfcc" in medians:
        print(f"memleak-bpfcc / {leaktrace} time per call: {medians['memleak-bpfcc'] / medians[leaktrace]:.2f}")
    else:
        print("memleak-bpfcc not installed: no comparison")


def overhead(binary: Path, args: argparse.Namespace, threads: int) -> None:
    workload = f"{binary} {threads} {args.calls} {args.leak_permille} {START_DELAY_MS}"
    leaktrace = [sys.executable, "-m", "leaktrace.cli"]
    tools = {
        "untraced": workload.split(),
        # leaktrace's probes with empty programs: the traps alone, the floor of any per-call uprobe tracer.
        "empty probes": [sys.executable, str(HERE / "empty_probes.py"), *workload.split()],
        "leaktrace": [*leaktrace, "-c", workload, "--json", "3600"],
        "leaktrace size-filtered": [*leaktrace, "-c", workload, "--json", "--options", "backtrace_size=320", "3600"],
        "leaktrace --engine preload": [*leaktrace, "-c", workload, "--json", "--engine", "preload", "3600"],
        # No size of the workload gets a stack: the library's table alone.
        "preload without stacks": [
            *leaktrace,
            "-c",
            workload,
            "--json",
            "--engine",
            "preload",
            "--options",
            "backtrace_size=1",
            "3600",
        ],
        # The allocator-side checks alone: a header, guards and fills on every block.
        "preload guard fill": [
            *leaktrace,
            "-c",
            workload,
            "--json",
            "--engine",
            "preload",
            "--options",
            "guard fill backtrace_size=1",
            "3600",
        ],
    }
    print_table(
        f"workload: {threads} thread(s) x {args.calls} malloc/free pairs, sizes 24/64/320/4096, "
        f"{args.leak_permille / 10:g}% leaked; {args.rounds} rounds, interleaved",
        interleaved(tools, workload, args.rounds),
        "leaktrace",
    )


def deep_overhead(binary: Path, args: argparse.Namespace, depth: int = DEEP) -> None:
    """The mix called depth frames below each thread's start, built without frame pointers:
    the DWARF walk against the empty-probe floor, the frame-pointer walk and memleak."""
    workload = f"{binary} 1 {args.calls} {args.leak_permille} {START_DELAY_MS} {depth}"
    leaktrace = [sys.executable, "-m", "leaktrace.cli", "-c", workload, "--json"]
    tools = {
        "untraced": workload.split(),
        "empty probes": [sys.executable, str(HERE / "empty_probes.py"), *workload.split()],
        "leaktrace (dwarf)": [*leaktrace, "3600"],
        "leaktrace --unwind fp": [*leaktrace, "--unwind", "fp", "3600"],
    }
    medians = interleaved(tools, workload, args.rounds)
    print_table(
        f"deep workload: 1 thread x {args.calls} pairs, {depth} calls below the thread's start, "
        f"no frame pointers; 16 frames kept; {args.rounds} rounds, interleaved",
        medians,
        "leaktrace (dwarf)",
    )
    # Per call: a malloc and a free each trap; only the malloc's return walks its 16 frames.
    above = 2 * (medians["leaktrace (dwarf)"] - medians["empty probes"])
    # The frame-pointer walk stops at frame 1 here (no frame pointers): the other 15 are the walk's.
    walk = 2 * (medians["leaktrace (dwarf)"] - medians["leaktrace --unwind fp"])
    print(
        f"leaktrace with DWARF stacks above the empty-probe floor: {above:.0f} ns per malloc; "
        f"the 15 frames beyond the fp walk's one: {walk:.0f} ns, {walk / 15:.0f} ns per frame"
    )


def next_change(watch: subprocess.Popen, tool: subprocess.Popen | None, timeout: float = 60) -> int:
    """The CLOCK_MONOTONIC ns of probe_watch's next "traced"/"untraced" line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([watch.stdout], [], [], 0.2)[0]:
            return int(watch.stdout.readline().split()[1])
        if tool is not None and tool.poll() is not None:
            raise RuntimeError(f"{tool.args[0]} exited ({tool.returncode}) before its probes went live")
    raise RuntimeError("probe_watch saw no change of its allocator's speed")


def start_and_stop(argv: list[str], watch: subprocess.Popen) -> tuple[float, float]:
    """Seconds from start until probe_watch feels the probes, and from SIGINT to the tool's exit."""
    started = time.monotonic_ns()
    tool = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        live_ns = next_change(watch, tool)
    finally:
        stopping = time.monotonic()
        tool.send_signal(signal.SIGINT)
        tool.wait(timeout=300)
    stop_s = time.monotonic() - stopping
    next_change(watch, None)  # its probes are gone before the next round starts
    return (live_ns - started) / 1e9, stop_s


def start_up_and_shutdown(binary: Path, rounds: int) -> None:
    # The target's own view of "probes live" (malloc and free probed): memleak prints its ready line
    # before it attaches, and attaches free near the end.
    watch = subprocess.Popen([str(binary)], stdout=subprocess.PIPE, text=True)
    try:
        tools = {"leaktrace": [sys.executable, "-m", "leaktrace.cli", "-p", str(watch.pid), "3600"]}
        memleak = shutil.which("memleak-bpfcc")
        if memleak:
            tools["memleak-bpfcc"] = [memleak, "-p", str(watch.pid), "3600"]
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in tools}
        for _ in range(rounds):
            for name, argv in tools.items():
                samples[name].append(start_and_stop(argv, watch))
    finally:
        watch.kill()
        watch.wait()
    print(f"{'':26}{'start-up s':>12}{'shutdown s':>12}   (-p PID, command to probes live; medians)")
    for name, values in samples.items():
        print(
            f"{name:26}{statistics.median(v[0] for v in values):12.2f}{statistics.median(v[1] for v in values):12.2f}"
        )
    if "memleak-bpfcc" in samples:
        # Round by round: the VM's speed drifts between rounds more than the tools differ.
        later = statistics.median(
            ours[0] - theirs[0] for ours, theirs in zip(samples["leaktrace"], samples["memleak-bpfcc"])
        )
        print(f"leaktrace's start-up minus memleak's, same round (median): {later:+.3f} s")


def table_build_time() -> None:
    """The unwind tables of python3, libc and ld.so: compiled from readelf's CFI (cold), and
    read back from the on-disk cache at the next start (warm)."""
    from leaktrace.platform.elf import ElfFile
    from leaktrace.unwind.tables import TableCache, UnwindTables

    files = [
        os.path.realpath(path)
        for path in ("/usr/bin/python3", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2")
    ]
    with tempfile.TemporaryDirectory() as cache:
        timings, rows = [], 0
        for _ in ("cold", "warm"):
            tables = UnwindTables(TableCache(cache))  # a new start: nothing in memory
            started = time.perf_counter()
            found = [tables.table_of(ElfFile(path)) for path in files]
            timings.append(time.perf_counter() - started)
            rows = sum(table.row_count for table in found)
    print(
        f"unwind tables of {', '.join(os.path.basename(p) for p in files)} ({rows} rows): "
        f"cold {timings[0]:.3f} s, warm (cached) {timings[1]:.4f} s"
    )


def report_time(binary: Path, live: int) -> None:
    settings = EngineSettings(max_live=max(EngineSettings().max_live, live + live // 5))
    with BpfTrace.launch([str(binary), str(live)], settings) as trace:
        deadline = time.monotonic() + 600
        while trace.poll() and trace.engine.reader.counters().allocations < live + 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        started = time.perf_counter()
        snapshot = trace.snapshot()
        snap_s = time.perf_counter() - started
        symbolizer = Symbolizer()  # one per trace, as the report loop keeps it
        render_s = []
        for _ in ("first report", "next report"):
            started = time.perf_counter()
            render_text(symbolizer.symbolize(snapshot))
            render_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        walked = trace.snapshot(older_than_ms=0)
        walk_s = time.perf_counter() - started
        os.kill(trace.pid, 9)
    assert snapshot.live_allocations >= live and walked.live_allocations == snapshot.live_allocations
    print(
        f"report at {snapshot.live_allocations} live allocations: snapshot {snap_s:.4f} s, "
        f"symbolize+render {render_s[0]:.4f} s (the next report: {render_s[1]:.4f} s), "
        f"full live-map walk (--older-than) {walk_s:.3f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--leak-permille", type=int, default=10)
    parser.add_argument("--skip-overhead", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        binaries = build(Path(out))
        if not args.skip_overhead:
            for threads in args.threads:
                overhead(binaries["alloc_bench"], args, threads)
            deep_overhead(binaries["alloc_bench_nofp"], args)
            start_up_and_shutdown(binaries["probe_watch"], args.rounds)
        table_build_time()
        for live in (100_000, 1_000_000):
            report_time(binaries["hold"], live)


if __name__ == "__main__":
    main()
