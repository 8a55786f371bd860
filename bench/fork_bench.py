"""What fork following costs per fork: a process holding 10, 100 or 1,000 live blocks forks
200 children one after the other (each exits at once), under `leaktrace -c` and under
`leaktrace -c -f` (each child is traced with the blocks it inherits, which leaktrace copies
and reports once it has exited), and under -f with a live table a hundred times smaller
(--max-live 12000: the cost must follow what is live, not the table's size). The command
does not wait for leaktrace's work (the kernel side serves a child until its copy is made)
except at its exit, where it is held until every child is reported: the cost per fork is
leaktrace's whole run, start to end, less the run without -f, over the forks. Prints
medians; run as root from the repo:

    .venv/bin/python bench/fork_bench.py [--rounds 3] [--forks 200]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent


def seconds(argv: list[str]) -> float:
    started = time.monotonic()
    subprocess.run(argv, capture_output=True, text=True, check=True, timeout=600)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--forks", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        binary = Path(out) / "fork_bench"
        subprocess.run(["gcc", "-O2", "-o", str(binary), str(HERE / "fork_bench.c")], check=True)
        leaktrace = [sys.executable, "-m", "leaktrace.cli"]
        print(
            f"{'live blocks':>12}{'leaktrace s':>13}{'-f s':>8}{'-f, 1% table s':>16}"
            f"{'ms per fork':>13}{'(1% table)':>12}"
        )
        for live in (10, 100, 1000):
            workload = f"{binary} {live} {args.forks}"
            tools = {
                "leaktrace": [*leaktrace, "-c", workload, "3600"],
                "-f": [*leaktrace, "-f", "-c", workload, "3600"],
                "-f, 1% table": [*leaktrace, "-f", "--max-live", "12000", "-c", workload, "3600"],
            }
            samples: dict[str, list[float]] = {name: [] for name in tools}
            for _ in range(args.rounds):
                for name, argv in tools.items():
                    samples[name].append(seconds(argv))
            plain, follow, small = (statistics.median(samples[name]) for name in tools)
            print(
                f"{live:12}{plain:13.2f}{follow:8.2f}{small:16.2f}"
                f"{(follow - plain) / args.forks * 1e3:13.2f}{(small - plain) / args.forks * 1e3:12.2f}"
            )


if __name__ == "__main__":
    main()
