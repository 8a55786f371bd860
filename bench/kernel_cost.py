"""allocbench on the running kernel, as ratios (a test VM's times under TCG are not real ones):
leaktrace's BPF engine and its probes with empty programs (the traps alone, the floor of any
per-call uprobe tracer) against the untraced run, rounds interleaved. Run as root, in each VM:

    scripts/vm.sh --kernel 5.10 -- .venv/bin/python bench/kernel_cost.py [--calls 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from run_bench import HERE, START_DELAY_MS, build, interleaved

from leaktrace.sources.bpf.kernel_features import features_off


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        workload = f"{build(Path(out))['alloc_bench']} 1 {args.calls} 10 {START_DELAY_MS}"
        tools = {
            "untraced": workload.split(),
            "empty probes": [sys.executable, str(HERE / "empty_probes.py"), *workload.split()],
            "leaktrace": [sys.executable, "-m", "leaktrace.cli", "-c", workload, "--json", "3600"],
        }
        # No memleak: under TCG its compile outlasts the workload's start delay (it attaches late).
        medians = interleaved(tools, workload, args.rounds, memleak=False)
    floor = medians["empty probes"] - medians["untraced"]
    added = medians["leaktrace"] - medians["empty probes"]
    print(f"kernel {os.uname().release}: {args.calls} malloc/free pairs, 1 thread, {args.rounds} rounds")
    print("features off: " + ("; ".join(line.split(":")[0] for line in features_off()) or "none"))
    for name, ns in medians.items():
        print(f"  {name:<14} {ns:9.1f} ns per call  {ns / medians['untraced']:6.2f}x untraced")
    print(f"leaktrace above the floor / the floor above untraced: {added / floor:.2f}")


if __name__ == "__main__":
    main()
