"""What the BPF engine adds to each allocator call, per allocator: alloc_bench's mix (malloc/free
pairs of 24/64/320/4096 bytes, 1 per mille kept) linked with glibc, and with Debian's
jemalloc, tcmalloc and mimalloc preloaded; each untraced and under `leaktrace -c`, rounds
interleaved. Prints ns per call untraced and traced, the added ns, and that as a multiple
of glibc's added ns (the overhead issue's goal: within 1.3x). Run as root:

    sudo .venv/bin/python bench/allocators_bench.py [--rounds 3] [--calls 200000]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from run_bench import ns_per_call  # bench/: the directory Python starts this script from

HERE = Path(__file__).parent
ALLOCATORS = {
    "glibc": "/lib/x86_64-linux-gnu/libc.so.6",
    "jemalloc": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "tcmalloc": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "mimalloc": "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2.0",
}


def run(binary: Path, library: str, calls: int, traced: bool) -> float:
    preload = [] if library == ALLOCATORS["glibc"] else ["env", f"LD_PRELOAD={library}"]
    command = [*preload, str(binary), "1", str(calls), "1"]
    if not traced:
        return ns_per_call(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    leaktrace = [sys.executable, "-m", "leaktrace.cli", "-c", " ".join(command), "--lib", library, "3600"]
    result = subprocess.run(leaktrace, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"leaktrace failed on {library}: {result.stderr[-500:]}")
    return ns_per_call(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        binary = Path(directory) / "alloc_bench"
        subprocess.run(
            ["gcc", "-O2", "-fno-omit-frame-pointer", "-pthread", "-o", binary, HERE / "alloc_bench.c"], check=True
        )
        times: dict[tuple[str, bool], list[float]] = {}
        for _ in range(args.rounds):
            for name, library in ALLOCATORS.items():
                for traced in (False, True):
                    times.setdefault((name, traced), []).append(run(binary, library, args.calls, traced))
    median = {key: statistics.median(values) for key, values in times.items()}
    added = {name: median[name, True] - median[name, False] for name in ALLOCATORS}
    print(f"{'allocator':<10} {'untraced ns':>12} {'traced ns':>10} {'added ns':>9} {'x glibc':>8}")
    for name in ALLOCATORS:
        print(
            f"{name:<10} {median[name, False]:>12.1f} {median[name, True]:>10.1f} {added[name]:>9.1f}"
            f" {added[name] / added['glibc']:>8.2f}"
        )


if __name__ == "__main__":
    main()
