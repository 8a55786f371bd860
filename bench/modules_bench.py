"""The cost of each module a traced command dlopens: a program that loads N copies of a small
library, one after another (each allocating once), untraced and under `leaktrace -c`, for
N in 10, 100 and 1,000 (or --counts). Run as root:

    .venv/bin/python bench/modules_bench.py [--counts 10,100,1000]

Each dlopen stops the command at its next allocator call until the new module's unwind
tables are in (so its constructor's stacks are whole): the figure is what that costs per
module, and whether it grows with the modules already loaded.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODULE = "#include <stdlib.h>\nvoid *volatile kept;\nvoid touch(void) { kept = malloc(16); }\n"
LOADER = Path(__file__).parents[1] / "tests" / "integration" / "programs" / "many_modules.c"


def build(directory: Path, count: int) -> Path:
    (directory / "m.c").write_text(MODULE)
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", directory / "m.so", directory / "m.c"], check=True)
    subprocess.run(["gcc", "-O1", "-o", directory / "loader", LOADER, "-ldl"], check=True)
    for i in range(count):  # distinct files: each is a module of its own
        shutil.copy(directory / "m.so", directory / f"m{i}.so")
    return directory / "loader"


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="10,100,1000")
    counts = [int(count) for count in parser.parse_args().counts.split(",")]
    with tempfile.TemporaryDirectory() as directory:
        loader = build(Path(directory), max(counts))
        print(f"{'modules':>8} {'untraced s':>11} {'leaktrace -c s':>15} {'ms per module':>14}")
        for count in counts:
            command = f"{loader} {directory} {count}"
            untraced = timed([str(loader), directory, str(count)])
            traced = timed([sys.executable, "-m", "leaktrace.cli", "-c", command, "3600"])
            empty = timed([sys.executable, "-m", "leaktrace.cli", "-c", f"{loader} {directory} 0", "3600"])
            print(f"{count:>8} {untraced:>11.3f} {traced:>15.2f} {(traced - empty) / count * 1000:>14.1f}")


if __name__ == "__main__":
    main()
