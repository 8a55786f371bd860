"""The reachability check at scale: a process with N blocks of SIZE bytes (1,000,000 of
1 KiB by default: a 1 GiB heap, bench/big_heap.c), 1% of them unreachable, traced from its
start; prints how long the process stood still, how long the sweep took and its rate. With
--untraced the process runs untraced and is judged as `leaktrace heap -p PID --unreachable`
judges it (the glibc heap walk), with the walk's rate too. Run as root:

    .venv/bin/python bench/unreachable_bench.py [--blocks 1000000] [--size 1024] [--untraced]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from leaktrace import BpfTrace
from leaktrace.reachability.unreachable import examine_heap

HERE = Path(__file__).parent


def wait_for(ready: Path, poll=lambda: None) -> None:
    while not ready.exists() or not ready.read_text().endswith("\n"):
        poll()
        time.sleep(0.05)


def traced(argv: list[str], ready: Path) -> None:
    with BpfTrace.launch(argv) as trace:
        wait_for(ready, trace.poll)
        started = time.monotonic()
        report = trace.check_unreachable()
        total = time.monotonic() - started
        os.kill(trace.pid, signal.SIGKILL)
    heap_gib = report.allocation_bytes / 2**30
    print(
        f"{report.num_allocations} allocations, {heap_gib:.2f} GiB judged; "
        f"unreachable: {report.num_leaks} allocations, {report.leak_bytes} bytes, in {report.reported} leaks"
    )
    print(
        f"  the process stood still {report.pause_seconds:.2f} s (registers, maps, and a copy of its writable memory)"
    )
    print(
        f"  sweep (mark, fold, merge): {report.sweep_seconds:.2f} s = {heap_gib / report.sweep_seconds:.2f} GiB/s, "
        f"{report.num_allocations / report.sweep_seconds / 1e6:.2f} M allocations/s"
    )
    print(f"  whole check, including reading the live table: {total:.2f} s")


def untraced(argv: list[str], ready: Path) -> None:
    target = subprocess.Popen(argv)
    try:
        wait_for(ready)
        started = time.monotonic()
        heap = examine_heap(target.pid, unreachable=True)
        total = time.monotonic() - started
    finally:
        target.kill()
        target.wait()
    walk, report = heap.walk, heap.unreachable
    heap_gib = int(walk.usable.sum()) / 2**30
    print(
        f"{len(walk.addresses)} blocks in use, {heap_gib:.2f} GiB (usable), walk complete: {walk.complete}; "
        f"unreachable: {report.num_leaks} blocks, {report.leak_bytes} bytes"
    )
    print(
        f"  the process stood still {heap.pause_seconds:.2f} s = {heap.pause_seconds / heap_gib:.2f} s/GiB "
        "(registers, maps, and a copy of its writable memory)"
    )
    print(
        f"  walk: {walk.walk_seconds:.2f} s = {heap_gib / walk.walk_seconds:.2f} GiB/s, "
        f"{len(walk.addresses) / walk.walk_seconds / 1e6:.2f} M chunks/s"
    )
    print(f"  sweep (mark, fold, merge): {report.sweep_seconds:.2f} s = {heap_gib / report.sweep_seconds:.2f} GiB/s")
    print(f"  whole command: {total:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--untraced", action="store_true", help="judge an untraced process through the heap walk")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        binary, ready = Path(tmp) / "big_heap", Path(tmp) / "ready"
        subprocess.run(
            ["gcc", "-O2", "-fno-omit-frame-pointer", "-o", str(binary), str(HERE / "big_heap.c")], check=True
        )
        (untraced if args.untraced else traced)([str(binary), str(args.blocks), str(args.size), str(ready)], ready)


if __name__ == "__main__":
    main()
