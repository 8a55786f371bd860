"""The in-process engines against each other, in one run of interleaved rounds: leaktrace's
preload library without stacks, with stacks by libgcc's _Unwind_Backtrace and by its own
walk (CFI rules cached by pc), sampled at 512 KiB (--sample), heaptrack and memray's native mode, on alloc_bench's mix
called directly below the thread's start and 16 calls deeper, at 1 and 2 threads. Every
tool takes whole stacks (leaktrace with --frames 64); the workload is built without frame
pointers, as distributions build. Prints median ns per call and ratios; run from the repo:

    .venv/bin/python bench/preload_bench.py [--rounds 3] [--threads 1 2] [--calls 2000000]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from run_bench import ns_per_call, print_medians  # the workload's timing line, the table

HERE = Path(__file__).parent
DEEP = 16  # the deep workload's calls below each thread's start routine
# memray traces a Python process: the workload's main is called through ctypes.
MEMRAY_HOST = (
    "import ctypes, sys; a = [x.encode() for x in sys.argv[1:]]; "
    "ctypes.CDLL(a[0].decode()).main(len(a), (ctypes.c_char_p * len(a))(*a))"
)


def build(out: Path) -> tuple[Path, Path]:
    """alloc_bench as a program and as a library (for memray's Python host), no frame pointers."""
    source = str(HERE / "alloc_bench.c")
    program, library = out / "alloc_bench", out / "liballoc_bench.so"
    flags = ["gcc", "-O2", "-fomit-frame-pointer", "-pthread"]
    subprocess.run([*flags, "-o", str(program), source], check=True)
    subprocess.run([*flags, "-shared", "-fPIC", "-o", str(library), source], check=True)
    return program, library


def run_to_end(argv: list[str], env: dict[str, str] | None = None) -> float:
    """Runs a tool on the workload to its end, for its ns per call; a tool that failed is an
    error, never a figure."""
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0 or "Traceback" in done.stderr:
        raise RuntimeError(f"{' '.join(argv)} failed (exit status {done.returncode}): {done.stderr[-2000:]}")
    return ns_per_call(done.stdout)


def tools(program: Path, library: Path, workload: list[str], out: Path) -> dict[str, tuple[list[str], dict | None]]:
    leaktrace = [sys.executable, "-m", "leaktrace.cli", "-c", " ".join([str(program), *workload]), "--json"]
    preload = [*leaktrace, "--engine", "preload", "--frames", "64"]
    found = {
        "untraced": ([str(program), *workload], None),
        "preload without stacks": ([*preload, "--options", "backtrace_size=1", "3600"], None),
        "preload stacks (libgcc)": ([*preload, "3600"], {**os.environ, "LEAKTRACE_UNWINDER": "libgcc"}),
        "preload stacks (rules)": ([*preload, "3600"], None),
        "preload --sample 512KiB": ([*preload, "--sample", "512KiB", "3600"], None),
    }
    heaptrack = shutil.which("heaptrack")
    if heaptrack:
        found["heaptrack"] = ([heaptrack, "-o", str(out / "heaptrack"), str(program), *workload], None)
    if importlib.util.find_spec("memray"):
        found["memray --native"] = (
            [
                sys.executable,
                "-m",
                "memray",
                "run",
                "--native",
                "-q",
                "-f",
                "-o",
                str(out / "memray.bin"),
                "-c",
                MEMRAY_HOST,
                str(library),
                *workload,
            ],
            None,
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    # Long enough that a tool's start and end (heaptrack's, leaktrace's own start on the other
    # core) are a small part: at 200,000 they were most of heaptrack's time per call.
    parser.add_argument("--calls", type=int, default=2_000_000)
    parser.add_argument("--leak-permille", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        program, library = build(out)
        for depth in (0, DEEP):
            for threads in args.threads:
                workload = [str(threads), str(args.calls), str(args.leak_permille), "0", str(depth)]
                runs = tools(program, library, workload, out)
                samples: dict[str, list[float]] = {name: [] for name in runs}
                for _ in range(args.rounds):
                    for name, (argv, env) in runs.items():
                        samples[name].append(run_to_end(argv, env))
                medians = {name: statistics.median(values) for name, values in samples.items()}
                print_medians(
                    f"{threads} thread(s) x {args.calls} malloc/free pairs, {depth} calls below the thread's "
                    f"start; whole stacks; {args.rounds} rounds, interleaved",
                    medians,
                )
                if "heaptrack" in medians:
                    ours = medians["preload stacks (rules)"]
                    print(f"preload stacks (rules) / heaptrack time per call: {ours / medians['heaptrack']:.2f}")
                print()


if __name__ == "__main__":
    main()
