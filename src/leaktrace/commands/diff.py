"""`leaktrace diff OLD NEW`: what changed, site by site, between two reports (JSON or pprof)."""

from __future__ import annotations

import argparse
import sys

from leaktrace.errors import UsageError
from leaktrace.outputs.renderers import RENDERERS, SiteChanges
from leaktrace.outputs.report_diff import (
    REPORT_READ_LIMIT,
    UnreadableReport,
    compare,
    read_sites,
)
from leaktrace.platform.process import printable
from leaktrace.platform.target_files import read_regular

from . import ArgumentParser, Command, bounded_int


class DiffCommand(Command):
    name = "diff"
    help = (
        "Compare two reports site by site: live bytes and blocks before, after and the change, the largest "
        "change first; sites that appeared or vanished are marked. OLD and NEW are files of --json report "
        "lines (the last report of each) or --pprof profiles."
    )

    def prepare_parser(self, parser: ArgumentParser) -> None:
        parser.add_argument("old", metavar="OLD", help="the earlier report (JSON lines or pprof)")
        parser.add_argument("new", metavar="NEW", help="the later report (JSON lines or pprof)")
        parser.add_argument("--json", action="store_true", help="one JSON object: every site, unchanged ones too")
        parser.add_argument(
            "--top", type=bounded_int(1), default=50, metavar="N", help="sites listed in the text (default 50)"
        )

    def run(self, args: argparse.Namespace) -> int:
        sites = []
        for path in (args.old, args.new):
            try:
                sites.append(read_sites(read_regular(path, REPORT_READ_LIMIT)))
            except OSError as e:  # OLD and NEW are arguments: a file that cannot be read is a usage error
                raise UsageError(f"cannot read {printable(path)}: {e.strerror or e}") from None
            except UnreadableReport as e:
                raise UsageError(f"{printable(path)}: {e}") from None
        output = RENDERERS.diff_json if args.json else RENDERERS.diff_text
        sys.stdout.write(output.render(SiteChanges(compare(*sites), args.old, args.new, args.top)).decode())
        return 0
