"""`leaktrace heap -p PID [--unreachable] [--json]`: a running process's glibc heap, walked
once while it stands still; no probe is attached, so it costs the process nothing per call."""

from __future__ import annotations

import argparse
import sys
import time

from leaktrace.analysis.symbolize import Symbolizer
from leaktrace.errors import UsageError
from leaktrace.model.snapshot import UNREACHABLE_LIMIT, Counters, Snapshot
from leaktrace.outputs.renderers import RENDERERS, HeapWalk
from leaktrace.platform.arch import HEAP_WALK, check_machine
from leaktrace.reachability.unreachable import examine_heap

from . import ArgumentParser, Command, bounded_int
from .outputs import write_fully


class HeapCommand(Command):
    name = "heap"
    help = (
        "Walk a running process's glibc heap once (no probes): blocks in use per arena, sizes, free "
        "bytes; with --unreachable, the blocks nothing reachable points to."
    )

    def prepare_parser(self, parser: ArgumentParser) -> None:
        parser.add_argument("-p", "--pid", type=bounded_int(1), required=True, help="the process")
        parser.add_argument(
            "--unreachable", action="store_true", help="also judge every block: which ones nothing reachable points to"
        )
        parser.add_argument("--contents", action="store_true", help="--unreachable: the first 32 bytes of each leak")
        parser.add_argument(
            "--limit",
            type=bounded_int(0),
            metavar="N",
            help=f"--unreachable: leaks shown (default {UNREACHABLE_LIMIT})",
        )
        parser.add_argument("--json", action="store_true", help="one JSON object")

    def run(self, args: argparse.Namespace) -> int:
        if (args.contents or args.limit is not None) and not args.unreachable:
            raise UsageError(f"{'--contents' if args.contents else '--limit'} needs --unreachable")
        limit = UNREACHABLE_LIMIT if args.limit is None else args.limit
        check_machine(HEAP_WALK)
        report = examine_heap(args.pid, args.unreachable, limit)
        unreachable = report.unreachable
        symbolized = Symbolizer().symbolize(Snapshot(time.time(), (), Counters(), unreachable=unreachable))
        output = RENDERERS.heap_json if args.json else RENDERERS.heap_text
        write_fully(sys.stdout, output.render(HeapWalk(report, symbolized, args.contents)))
        return 0
