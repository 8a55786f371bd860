"""`leaktrace features`: what the running kernel offers the BPF engine, feature by feature
(on or off, the release that brings it, what the engine does without it), as `bpftool
feature probe` lists a kernel's BPF features."""

from __future__ import annotations

import argparse
import sys

from . import ArgumentParser, Command


class FeaturesCommand(Command):
    name = "features"
    help = "the kernel features the BPF engine uses: on or off here, the release that brings each"

    def prepare_parser(self, parser: ArgumentParser) -> None:
        pass

    def run(self, args: argparse.Namespace) -> int:
        from leaktrace.sources.bpf.kernel_features import feature_table

        sys.stdout.write(feature_table())
        return 0
