"""What the totals per site, the peak and the short-lived count cost, against the code before
them, in one run of interleaved rounds: alloc_bench's mix (with 1 and 2 threads) traced from
its start with -c, by the preload library (stacks on) and by the BPF engine, each from this
tree and from BASE, a git revision built in a worktree of its own. Prints the median ns per
call of each and the difference; run from the repo:

    .venv/bin/python bench/views_cost.py [--base 228898d] [--rounds 5] [--threads 1 2]
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

HERE = Path(__file__).parent
ROOT = HERE.parent
CALLS = {"preload": 1_000_000, "bpf": 200_000}  # a BPF call costs ~20x a library one: runs of a few seconds
LEAK_PERMILLE = 5


def worktree(base: str, into: Path) -> Path:
    """BASE checked out and its extensions built in place, for its leaktrace package."""
    tree = into / "base"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), base], check=True)
    subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tree, check=True, capture_output=True)
    return tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="228898d", help="the revision before the views (default 228898d)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        program, _ = build(out)
        trees = {"now": ROOT, "base": worktree(args.base, out)}
        try:
            times: dict[tuple[str, int, str], list[float]] = {}
            for round_number in range(args.rounds):
                for engine, threads, (name, tree) in (
                    (e, t, item) for e in CALLS for t in args.threads for item in trees.items()
                ):
                    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
                    workload = f"{program} {threads} {CALLS[engine] // threads} {LEAK_PERMILLE}"
                    argv = [sys.executable, "-m", "leaktrace.cli", "-c", workload, "--engine", engine, "--json"]
                    times.setdefault((engine, threads, name), []).append(run_to_end([*argv, "3600"], env))
                print(f"round {round_number + 1} of {args.rounds} done", file=sys.stderr)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(trees["base"])], check=False)
    print(f"median ns per call over {args.rounds} rounds, this tree against {args.base}:")
    print(f"{'engine':<8} {'threads':>7} {'base':>9} {'now':>9} {'change':>9} {'ratio':>7}")
    for engine in CALLS:
        for threads in args.threads:
            base = statistics.median(times[engine, threads, "base"])
            now = statistics.median(times[engine, threads, "now"])
            print(f"{engine:<8} {threads:>7} {base:>9.1f} {now:>9.1f} {now - base:>+9.1f} {now / base:>7.3f}")


if __name__ == "__main__":
    main()
