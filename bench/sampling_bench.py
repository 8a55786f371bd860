"""Sampling's two figures in one run: what an unsampled call costs, and how close the
estimates come. Run as root from the repo:

    .venv/bin/python bench/sampling_bench.py [--rounds 5] [--threads 1 8] [--seed N]

- Cost: alloc_bench's malloc/free mix with leaktrace's library preloaded directly (no
  leaktrace process sharing the cores), in chunks that alternate between the library's
  malloc/free and glibc's own in one process (bench/sampling_cost.c), so that a VM's slow
  spells fall on both: ns a pair over glibc's, at 512 KiB and with no call sampled.
- Estimates: sampled_sites (three sites of MIB MiB each in 64-byte, page and MiB blocks,
  16 x MIB MiB of churn) under `leaktrace -c --sample` at 64 KiB and 512 KiB, both
  engines, from one printed seed: each site's error against its true bytes, beside the
  Poisson bound 3 sigma the tests hold it to.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
PROGRAMS = HERE.parent / "tests" / "integration" / "programs"
RATE = 512 << 10
SITES = {"small_site": 64, "page_site": 4096, "big_site": 1 << 20}
MIB = 128
CHUNKS, CHUNK_PAIRS = 800, 2000  # a chunk lasts about 0.1 ms: few are cut by the scheduler


def build(out: Path) -> tuple[Path, Path]:
    """sampling_cost as distributions build (no frame pointers); sampled_sites with symbols."""
    bench, sites = out / "sampling_cost", out / "sampled_sites"
    for argv in (
        ["gcc", "-O2", "-fomit-frame-pointer", "-pthread", "-o", bench, HERE / "sampling_cost.c"],
        ["gcc", "-O1", "-g", "-fno-omit-frame-pointer", "-o", sites, PROGRAMS / "sampled_sites.c"],
    ):
        subprocess.run(argv, check=True)
    return bench, sites


def preloaded_environment(rate: int, seed: int) -> dict[str, str]:
    """The library preloaded as `leaktrace -c --engine preload --sample RATE` sets it up,
    without the dump at exit."""
    from leaktrace.sources.preload.table import preload_library

    return dict(
        os.environ,
        LD_PRELOAD=preload_library(),
        LIBC_DEBUG_MALLOC_OPTIONS="backtrace=64",
        LEAKTRACE_SAMPLE_BYTES=str(rate),
        LEAKTRACE_SAMPLE_SEED=str(seed),
    )


def cost(bench: Path, threads: int, rounds: int, seed: int) -> None:
    """Interposed over direct, per pair, in one process (sampling_cost.c): at 512 KiB (the
    sampled calls' stacks included) and at 1 TiB (no call sampled: the unsampled path alone)."""
    print(f"cost: {threads} thread(s), {rounds} runs of {CHUNKS // threads} chunks of {CHUNK_PAIRS} pairs each")
    for label, rate in (("512 KiB", RATE), ("unsampled", 1 << 40)):
        added, direct = [], []
        for _ in range(rounds):
            done = subprocess.run(
                [str(bench), str(threads), str(CHUNKS // threads), str(CHUNK_PAIRS)],
                capture_output=True,
                text=True,
                env=preloaded_environment(rate, seed),
                timeout=600,
                check=True,
            )
            _, alone, _, interposed = done.stdout.split()
            direct.append(float(alone))
            added.append(float(interposed) - float(alone))
        print(
            f"  {label:9}: {statistics.median(added):+5.1f} ns a pair over glibc's own "
            f"{statistics.median(direct):.1f} (runs {min(added):+.1f} to {max(added):+.1f})"
        )


def sampled_sites(sites: Path, engine: str, rate: int, seed: int) -> dict[str, int]:
    """site -> estimated bytes, from the last JSON report."""
    done = subprocess.run(
        [sys.executable, "-m", "leaktrace.cli", "-c", f"{sites} {MIB}", "--engine", engine, "--json"]
        + ["--sample", str(rate), "--sample-seed", str(seed), "3600"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"leaktrace --engine {engine} failed ({done.returncode}): {done.stderr[-1000:]}")
    found = dict.fromkeys([*SITES, "churn"], 0)
    for group in json.loads(lines[-1])["groups"]:
        names = [frame["function"] for frame in group["frames"]]
        site = next((name for name in names if name in found), None)
        if site:
            found[site] += group["bytes"]
    return found


def estimates(sites: Path, seed: int) -> None:
    true = MIB << 20
    print(f"estimates: sampled_sites {MIB} (each site {MIB} MiB, {16 * MIB} MiB of churn), seed {seed}")
    for rate in (64 << 10, RATE):
        for engine in ("preload", "bpf"):
            found = sampled_sites(sites, engine, rate, seed)
            parts = []
            for site, size in SITES.items():
                chance = -math.expm1(-size / rate)
                bound = 3 * size * math.sqrt(true // size * (1 - chance) / chance)
                parts.append(f"{site} {100 * (found[site] - true) / true:+.2f}% (3 sigma {100 * bound / true:.2f}%)")
            print(f"  {rate >> 10:3} KiB {engine:7}: " + ", ".join(parts) + f", churn {found['churn'] / 2**20:.2f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--seed", type=int, default=random.randrange(1 << 63))
    parser.add_argument("--parts", default="cost,estimates")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        bench, sites = build(Path(scratch))
        if "cost" in args.parts:
            for threads in args.threads:
                cost(bench, threads, args.rounds, args.seed)
        if "estimates" in args.parts:
            estimates(sites, args.seed)


if __name__ == "__main__":
    main()
