"""What the totals per site, the peak and the short-lived count cost, against the code before
them, in one run: alloc_bench's mix (with 1 and 2 threads) under the preload library (stacks
on, put in with LD_PRELOAD: leaktrace's launch adds nothing a call) and under the BPF engine
(leaktrace -c), each from this tree and from BASE, a git revision built in a worktree of its
own. This VM's speed moves between two levels minutes apart, so runs alternate, base then
now, and each pair's difference is taken: prints the median ns per call of each and the
median of the paired differences. Run from the repo:

    .venv/bin/python bench/views_cost.py [--base 228898d] [--pairs 15] [--threads 1 2] [--engines preload bpf]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from preload_bench import build, run_to_end

from leaktrace.platform.arch import built_here

HERE = Path(__file__).parent
ROOT = HERE.parent
CALLS = {"preload": 1_000_000, "bpf": 200_000}  # a BPF call costs ~20x a library one: runs of a few seconds
LEAK_PERMILLE = 5
OPTIONS = "backtrace=16"  # leaktrace's default depth


def worktree(base: str, into: Path) -> Path:
    """BASE checked out and its extensions built in place, for its leaktrace package."""
    tree = into / "base"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), base], check=True)
    subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tree, check=True, capture_output=True)
    return tree


def one_run(engine: str, tree: Path, program: Path, threads: int) -> float:
    """ns per call of one run of the workload under the engine of this tree."""
    workload = [str(program), str(threads), str(CALLS[engine] // threads), str(LEAK_PERMILLE)]
    if engine == "preload":
        library = built_here(tree / "src/leaktrace/sources/preload", "_malloc_debug")
        assert library, f"no preload library built in {tree}"
        env = {**os.environ, "LD_PRELOAD": library, "LIBC_DEBUG_MALLOC_OPTIONS": OPTIONS}
        return run_to_end(workload, env)
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    argv = [sys.executable, "-m", "leaktrace.cli", "-c", " ".join(workload), "--engine", "bpf", "--json", "3600"]
    return run_to_end(argv, env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="228898d", help="the revision before the views (default 228898d)")
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--engines", nargs="+", choices=list(CALLS), default=list(CALLS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        program, _ = build(out)
        base = worktree(args.base, out)
        try:
            runs: dict[tuple[str, int], list[tuple[float, float]]] = {}
            for pair in range(args.pairs):
                for engine in args.engines:
                    for threads in args.threads:
                        before = one_run(engine, base, program, threads)
                        runs.setdefault((engine, threads), []).append((before, one_run(engine, ROOT, program, threads)))
                print(f"pair {pair + 1} of {args.pairs} done", file=sys.stderr)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    print(f"ns per call, {args.pairs} pairs of runs (base {args.base}, then this tree), medians:")
    print(f"{'engine':<8} {'threads':>7} {'base':>9} {'now':>9} {'paired change':>14}")
    for (engine, threads), pairs in runs.items():
        before = statistics.median(b for b, _ in pairs)
        now = statistics.median(n for _, n in pairs)
        change = statistics.median(n - b for b, n in pairs)
        print(f"{engine:<8} {threads:>7} {before:>9.1f} {now:>9.1f} {change:>+14.1f}")


if __name__ == "__main__":
    main()
