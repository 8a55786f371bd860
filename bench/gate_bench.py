"""A suite of small test programs through each gate, as `make check` runs them one by one:
valgrind's memcheck, leaktrace's in-process gate and its BPF gate, each with
`--leak-check=full --error-exitcode=N`. Prints each gate's seconds for the whole suite and
a program, and whether every verdict (exit status, definitely lost bytes and blocks)
equals valgrind's. Run as root from the repo:

    .venv/bin/python bench/gate_bench.py [--programs 20]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROGRAMS = Path(__file__).parent.parent / "tests" / "integration" / "programs"
SUITE = ("leak_kinds", "overwritten", "sites", "threads")  # taken in turn, to --programs in all
ERROR = 9
LEAK_CHECK = ["--leak-check=full", f"--error-exitcode={ERROR}"]
GATES = {
    "valgrind": ["valgrind", "--leak-check-heuristics=none", *LEAK_CHECK],
    "leaktrace --engine preload": [sys.executable, "-m", "leaktrace.cli", "--engine", "preload", *LEAK_CHECK, "--"],
    "leaktrace (BPF)": [sys.executable, "-m", "leaktrace.cli", *LEAK_CHECK, "--"],
}
DEFINITE = re.compile(r"definitely lost: ([\d,]+) bytes in ([\d,]+) blocks")


def build(out: Path) -> list[Path]:
    built = []
    for name in SUITE:
        program = out / name
        subprocess.run(["gcc", "-O0", "-g", "-pthread", "-o", program, PROGRAMS / f"{name}.c"], check=True)
        built.append(program)
    return built


def verdict(argv: list[str]) -> tuple[int, tuple[str, str] | None, float]:
    """Exit status, the definitely lost (bytes, blocks) said, and seconds."""
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    found = DEFINITE.findall(done.stderr + done.stdout)
    return done.returncode, found[-1] if found else None, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        suite = build(Path(scratch))
        runs = [suite[i % len(suite)] for i in range(args.programs)]
        seconds = dict.fromkeys(GATES, 0.0)
        agreed = dict.fromkeys(GATES, 0)
        for program in runs:
            theirs = None
            for gate, prefix in GATES.items():
                status, lost, took = verdict([*prefix, str(program)])
                seconds[gate] += took
                theirs = theirs or (status, lost)
                agreed[gate] += (status, lost) == theirs
        print(f"{args.programs} programs ({', '.join(SUITE)} in turn), one gate run each, interleaved:")
        for gate in GATES:
            print(
                f"  {gate:28} {seconds[gate]:7.2f} s in all, {seconds[gate] / args.programs:5.2f} s a program, "
                f"{seconds[gate] / seconds['valgrind']:4.2f} of valgrind's time; "
                f"verdict equal to valgrind's on {agreed[gate]} of {args.programs}"
            )


if __name__ == "__main__":
    main()
