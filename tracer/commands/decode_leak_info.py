"""`leaktrace decode-leak-info FILE --backtrace-size N [--abi 32|64]`: a leak-info buffer as a table."""
from __future__ import annotations

import argparse

from tabulate import tabulate

from ..errors import RuntimeFailure
from ..render_leak_info import decode_leak_info
from . import ArgumentParser, Command


class DecodeLeakInfoCommand(Command):
    name = "decode-leak-info"
    help = "Print a get_malloc_leak_info buffer (as written by --leak-info) as a table."

    def prepare_parser(self, parser: ArgumentParser) -> None:
        parser.add_argument("file", help="the raw buffer")
        parser.add_argument("--backtrace-size", type=int, required=True, metavar="N",
                            help="pcs per entry, as get_malloc_leak_info returned it")
        parser.add_argument("--abi", type=int, choices=(32, 64), default=64, help="word size (default 64)")

    def run(self, args: argparse.Namespace) -> int:
        if not 1 <= args.backtrace_size <= 256:
            raise RuntimeFailure(f"--backtrace-size must be from 1 to 256, not {args.backtrace_size}")
        try:
            with open(args.file, "rb") as f:
                buffer = f.read()
        except OSError as e:
            raise RuntimeFailure(f"cannot read {args.file}: {e.strerror}") from None
        try:
            entries = decode_leak_info(buffer, args.backtrace_size, args.abi)
        except ValueError as e:
            raise RuntimeFailure(f"{args.file}: {e}") from None
        rows = [[int(e.zygote), e.size, e.num_allocations, e.size * e.num_allocations,
                 " ".join(f"{pc:x}" for pc in e.frames)] for e in entries]
        print(f"{len(entries)} entries, total_memory {sum(r[3] for r in rows)}")
        if rows:   # tabulate fails on column alignments without rows
            print(tabulate(rows, headers=["z", "size", "num", "bytes", "pcs"], tablefmt="simple",
                           colalign=("right", "right", "right", "right", "left"), disable_numparse=True))
        return 0
