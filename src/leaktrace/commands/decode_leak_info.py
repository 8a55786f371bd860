"""`leaktrace decode-leak-info FILE --backtrace-size N [--abi 32|64]`: a leak-info buffer as a table."""

from __future__ import annotations

import argparse
import sys

from leaktrace.android.leak_info import iter_leak_info
from leaktrace.errors import RuntimeFailure, UsageError
from leaktrace.platform.target_files import read_regular

from . import ArgumentParser, Command

LEAK_INFO_READ_LIMIT = 256 << 20  # bytes: a buffer of about 1.8 million 64-bit entries of 16 pcs
HEADERS = ("z", "size", "num", "bytes", "pcs")


class DecodeLeakInfoCommand(Command):
    name = "decode-leak-info"
    help = "Print a get_malloc_leak_info buffer (as written by --leak-info) as a table."

    def prepare_parser(self, parser: ArgumentParser) -> None:
        parser.add_argument("file", help="the raw buffer (a regular file of at most 256 MiB)")
        parser.add_argument(
            "--backtrace-size",
            type=int,
            required=True,
            metavar="N",
            help="pcs per entry, as get_malloc_leak_info returned it (1 to 256)",
        )
        parser.add_argument("--abi", type=int, choices=(32, 64), default=64, help="word size (default 64)")

    def run(self, args: argparse.Namespace) -> int:
        if not 1 <= args.backtrace_size <= 256:
            raise UsageError(f"--backtrace-size must be from 1 to 256, not {args.backtrace_size}")
        try:
            buffer = memoryview(read_regular(args.file, LEAK_INFO_READ_LIMIT))
        except OSError as e:
            raise RuntimeFailure(f"cannot read {args.file}: {e.strerror}") from None

        def rows():
            for e in iter_leak_info(buffer, args.backtrace_size, args.abi):
                yield (
                    str(int(e.zygote)),
                    str(e.size),
                    str(e.num_allocations),
                    str(e.size * e.num_allocations),
                    " ".join(f"{pc:x}" for pc in e.frames) + (f"  !{e.impossible}" if e.impossible else ""),
                )

        # Two passes over the buffer, none over a list of its rows: the widths and totals, then the rows.
        try:
            widths, entries, total, impossible = [len(h) for h in HEADERS], 0, 0, 0
            for row in rows():
                widths = [max(w, len(cell)) for w, cell in zip(widths, row)]
                entries, total, impossible = entries + 1, total + int(row[3]), impossible + ("  !" in row[4])
        except ValueError as e:
            raise RuntimeFailure(f"{args.file}: {e}") from None
        print(f"{entries} entries, total_memory {total}")
        if entries:
            line = "  ".join(f"{{:>{w}}}" for w in widths[:4]) + "  {}"
            print(line.format(*HEADERS).rstrip())
            print("  ".join("-" * w for w in widths))
            for row in rows():
                print(line.format(*row))
        if impossible:
            print(
                f"leaktrace: {args.file}: {impossible} entries cannot be real (marked !): no "
                "get_malloc_leak_info writes them",
                file=sys.stderr,
            )
        return 0
