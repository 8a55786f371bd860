"""The heap walk at scale: a process started untraced with N blocks of SIZE bytes (1,000,000
of 1 KiB by default: a 1 GiB heap, 1% of the blocks unreachable, bench/big_heap.c) judged as
`leaktrace heap -p PID --unreachable` judges it; prints the pause, the walk's rate and the
sweep's rate. Run as root:

    .venv/bin/python bench/heap_walk_bench.py [--blocks 1000000] [--size 1024]
"""
from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

from leaktrace.unreachable import examine_heap

HERE = Path(__file__).parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=1024)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        binary, ready = Path(tmp) / "big_heap", Path(tmp) / "ready"
        subprocess.run(["gcc", "-O2", "-o", str(binary), str(HERE / "big_heap.c")], check=True)
        target = subprocess.Popen([str(binary), str(args.blocks), str(args.size), str(ready)])
        try:
            while not ready.exists() or not ready.read_text().endswith("\n"):
                time.sleep(0.05)
            started = time.monotonic()
            heap = examine_heap(target.pid, unreachable=True)
            total = time.monotonic() - started
        finally:
            target.kill()
            target.wait()
    walk, report = heap.walk, heap.unreachable
    heap_gib = int(walk.usable.sum()) / 2**30
    print(f"{len(walk.addresses)} blocks in use, {heap_gib:.2f} GiB (usable), walk complete: {walk.complete}; "
          f"unreachable: {report.num_leaks} blocks, {report.leak_bytes} bytes")
    print(f"  the process stood still {heap.pause_seconds:.2f} s = {heap.pause_seconds / heap_gib:.2f} s/GiB "
          "(registers, maps, and a copy of its writable memory)")
    print(f"  walk: {walk.walk_seconds:.2f} s = {heap_gib / walk.walk_seconds:.2f} GiB/s, "
          f"{len(walk.addresses) / walk.walk_seconds / 1e6:.2f} M chunks/s")
    print(f"  sweep (mark, fold, merge): {report.sweep_seconds:.2f} s = {heap_gib / report.sweep_seconds:.2f} GiB/s")
    print(f"  whole command: {total:.2f} s")


if __name__ == "__main__":
    main()
