"""What Python frames cost per allocation, in both engines, in one run of interleaved rounds:
each CPython the walk knows that is on the machine (Debian's 3.11, pyenv's 3.12 and 3.13,
or --python) allocating through malloc from a Python loop with few Python frames above it
(4) and many (24), untraced, then under each engine with its Python walk and without it
(LEAKTRACE_PYTHON_FRAMES=no). Prints median ns per call and the extra ns the walk adds; run
from the repo:

    .venv/bin/python bench/python_frames_bench.py [--rounds 3] [--calls 300000] [--python PATH ...]
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
from pathlib import Path

from preload_bench import run_to_end  # a tool's run to its end, for its ns per call
from run_bench import print_medians

PYTHONS = (
    "/usr/bin/python3.11",
    "/root/.pyenv/versions/3.12.*/bin/python3.12",
    "/root/.pyenv/versions/3.13.*/bin/python3.13",
)
WORKLOAD = Path(__file__).parent / "python_alloc.py"
DEPTHS = (2, 22)  # Python calls below the module: 4 and 24 frames at the malloc


def tools(python: str, depth: int, calls: int) -> dict[str, tuple[list[str], dict | None]]:
    workload = [python, str(WORKLOAD), str(depth), str(calls)]
    leaktrace = [sys.executable, "-m", "leaktrace.cli", "-c", " ".join(workload), "--frames", "64", "--json", "3600"]
    without = {**os.environ, "LEAKTRACE_PYTHON_FRAMES": "no"}
    return {
        "untraced": (workload, None),
        "bpf, native frames": (leaktrace, without),
        "bpf, + python frames": (leaktrace, None),
        "preload, native frames": ([*leaktrace, "--engine", "preload"], without),
        "preload, + python frames": ([*leaktrace, "--engine", "preload"], None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=300_000)
    parser.add_argument("--python", action="append", help="an interpreter to run (default: those on the machine)")
    args = parser.parse_args()
    pythons = args.python or [path for pattern in PYTHONS for path in sorted(glob.glob(pattern))[-1:]]
    for python, depth in ((python, depth) for python in pythons for depth in DEPTHS):
        runs: dict[str, list[float]] = {}
        for _ in range(args.rounds):  # interleaved: a slow moment of the machine hits every tool
            for tool, (argv, env) in tools(python, depth, args.calls).items():
                runs.setdefault(tool, []).append(run_to_end(argv, env))
        medians = {tool: statistics.median(times) for tool, times in runs.items()}
        title = f"{python}: {depth + 2} Python frames at each malloc, {args.calls} calls, median of {args.rounds}"
        print_medians(title, medians)
        for engine in ("bpf", "preload"):
            extra = medians[f"{engine}, + python frames"] - medians[f"{engine}, native frames"]
            print(f"{engine}: the Python walk adds {extra:.0f} ns per call")
        print()


if __name__ == "__main__":
    main()
