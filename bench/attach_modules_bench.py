"""Seconds from `leaktrace -p PID` to its probes being live, against the number of modules the
process maps: a program that dlopened N distinct libraries (each with 2,000 functions' CFI,
as a mid-sized real library), for N in 5, 50 and 200 (or --counts), with an empty table
cache and then a warm one. Run as root:

    .venv/bin/python bench/attach_modules_bench.py [--counts 5,50,200] [--profile N]

--profile N prints where a warm attach to N modules spends its time (cProfile, in-process).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOADER = Path(__file__).parents[1] / "tests" / "integration" / "programs" / "many_modules.c"
FUNCTIONS = 2000


def module_source() -> str:
    """touch() and FUNCTIONS small functions that each keep a frame (a few CFI rows each)."""
    body = [f"long f{i}(long x) {{ volatile long a[4]; a[0] = x; return a[0] * {i + 3}; }}" for i in range(FUNCTIONS)]
    return "#include <stdlib.h>\nvoid *volatile kept;\nvoid touch(void) { kept = malloc(16); }\n" + "\n".join(body)


def build(directory: Path, count: int) -> Path:
    (directory / "m.c").write_text(module_source())
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", directory / "m.so", directory / "m.c"], check=True)
    subprocess.run(["gcc", "-O1", "-o", directory / "loader", LOADER, "-ldl"], check=True)
    for i in range(count):  # distinct files: each is a module of its own
        shutil.copy(directory / "m.so", directory / f"m{i}.so")
    return directory / "loader"


def time_to_live(pid: int, cache: str) -> float:
    """Seconds until leaktrace -p says its probes are live (then it is stopped with SIGINT)."""
    started = time.perf_counter()
    tracer = subprocess.Popen(
        [sys.executable, "-m", "leaktrace.cli", "-p", str(pid), "3600"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "LEAKTRACE_CACHE_DIR": cache},
    )
    assert tracer.stderr is not None
    for line in tracer.stderr:
        if "probes live" in line:
            break
    elapsed = time.perf_counter() - started
    tracer.send_signal(2)
    tracer.wait(timeout=60)
    return elapsed


def profile_attach(pid: int, cache: str) -> None:
    from leaktrace.sources.bpf.engine import EngineSettings
    from leaktrace.sources.bpf.trace import BpfTrace

    profiler = cProfile.Profile()
    profiler.enable()
    trace = BpfTrace.attach(pid, EngineSettings(table_cache=cache))
    profiler.disable()
    trace.close()
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="5,50,200")
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    args = parser.parse_args()
    counts = [int(count) for count in args.counts.split(",")]
    with tempfile.TemporaryDirectory() as directory:
        loader = build(Path(directory), max(counts + [args.profile]))
        print(f"{'modules':>8} {'exec maps':>10} {'cold s':>8} {'warm s':>8}")
        for count in counts + ([args.profile] if args.profile else []):
            target = subprocess.Popen([str(loader), directory, str(count), "hold"], stdout=subprocess.PIPE, text=True)
            try:
                assert target.stdout is not None and target.stdout.readline().strip() == "ready"
                with open(f"/proc/{target.pid}/maps") as maps:
                    executable = sum(1 for line in maps if line.split()[1][2] == "x")
                cache = tempfile.mkdtemp(dir=directory)
                os.chmod(cache, 0o700)
                if args.profile and count == args.profile:
                    time_to_live(target.pid, cache)
                    profile_attach(target.pid, cache)
                    continue
                cold, warm = time_to_live(target.pid, cache), time_to_live(target.pid, cache)
                print(f"{count:>8} {executable:>10} {cold:>8.2f} {warm:>8.2f}")
            finally:
                target.kill()
                target.wait()


if __name__ == "__main__":
    main()
