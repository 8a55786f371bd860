"""Which tool turns addresses into function, file:line and inlined frames: binutils'
addr2line (what leaktrace uses), elfutils' eu-addr2line and llvm-symbolizer, each on
the same 10,000 distinct addresses of libc's debug file (libc6-dbg), in one run.
Prints seconds per tool (median of --rounds) and how often each pair of tools gives the
same file and line for every frame at an address (inlined ones included).

    .venv/bin/python bench/symbolizer_bench.py [--rounds 3] [--addresses 10000]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import time

from leaktrace.analysis.symbolize import addr2line_answers, llvm_symbolizer_answers
from leaktrace.platform.elf import ElfFile

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


def addresses_in_functions(debug: ElfFile, count: int) -> list[int]:
    """count distinct addresses inside libc's sized functions, spread over all of them."""
    starts, symbols = debug._function_index
    random.seed(7)
    found: set[int] = set()
    sized = [s for s in symbols if s.size > 1]
    while len(found) < count:
        symbol = random.choice(sized)
        found.add(symbol.value + random.randrange(1, symbol.size))
    return sorted(found)


def _place(location: str) -> tuple[str, str]:
    """file basename and line of a file:line[:column] answer."""
    parts = location.split(" (discriminator")[0].rsplit("/", 1)[-1].split(":")
    return parts[0], parts[1] if len(parts) > 1 else "?"


def parse_pairs(text: str, addresses: list[int]) -> dict[int, tuple]:
    """(eu-)addr2line's answers: per address, the (file, line) of every frame, inlined ones first."""
    return {address: tuple(_place(place) for _, place in pairs) for address, pairs in addr2line_answers(text).items()}


def parse_llvm(text: str, addresses: list[int]) -> dict[int, tuple]:
    """llvm-symbolizer's answers, the same way."""
    return {
        address: tuple((os.path.basename(file or "??"), str(line or "?")) for _, file, line in chain)
        for address, chain in llvm_symbolizer_answers(text).items()
    }


def run(tool: list[str], stdin: str | None = None) -> tuple[float, str]:
    started = time.monotonic()
    out = subprocess.run(tool, input=stdin, capture_output=True, text=True, check=True).stdout
    return time.monotonic() - started, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--addresses", type=int, default=10_000)
    args = parser.parse_args()
    build_id = ElfFile(LIBC).build_id
    path = f"/usr/lib/debug/.build-id/{build_id[:2]}/{build_id[2:]}.debug"
    addresses = addresses_in_functions(ElfFile(path), args.addresses)
    hexes = [f"{a:#x}" for a in addresses]
    tools = {
        "addr2line -a -i -f": (["addr2line", "-a", "-i", "-f", "-e", path, *hexes], None, parse_pairs),
        "eu-addr2line -a -i -f": (["eu-addr2line", "-a", "-i", "-f", "-e", path, *hexes], None, parse_pairs),
        "llvm-symbolizer --inlining": (
            ["llvm-symbolizer", "--inlining", "--output-style=JSON", "--obj", path],
            "\n".join(hexes),
            parse_llvm,
        ),
    }
    tools = {name: tool for name, tool in tools.items() if shutil.which(tool[0][0])}
    times: dict[str, list[float]] = {name: [] for name in tools}
    answers: dict[str, dict[int, tuple[str, str]]] = {}
    for _ in range(args.rounds):
        for name, (argv, stdin, parse) in tools.items():
            seconds, out = run(argv, stdin)
            times[name].append(seconds)
            answers[name] = parse(out, addresses)
    print(f"{len(addresses)} distinct addresses in libc's debug file; {args.rounds} rounds, interleaved")
    names = list(tools)
    print(
        f"{'':30}{'seconds (median)':>18}"
        + "".join(f"{'same file:line as ' + other.split()[0]:>34}" for other in names)
    )
    for name in names:
        agreement = [
            sum(answers[name].get(a) == answers[other].get(a) for a in addresses) / len(addresses) for other in names
        ]
        print(f"{name:30}{statistics.median(times[name]):18.3f}" + "".join(f"{share:34.1%}" for share in agreement))


if __name__ == "__main__":
    main()
