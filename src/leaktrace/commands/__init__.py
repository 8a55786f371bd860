"""The CLI's commands: small classes behind one registry.

A command has a name, fills its own argparse parser and runs with the parsed
arguments, returning an exit status. `leaktrace ARGS` with no command name
runs the default command, `trace`.
"""

from __future__ import annotations

import argparse
import importlib

from leaktrace.errors import UsageError


def bounded_int(low: int, high: int | None = None):
    """An argparse type: a whole number from low to high (no upper bound when None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
        if value < low or (high is not None and value > high):
            bounds = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"{value} is out of range ({bounds})")
        return value

    return parse


class ArgumentParser(argparse.ArgumentParser):
    """Reports a usage error as one line (through UsageError) instead of usage text."""

    def error(self, message: str):
        raise UsageError(message)


class Command:
    name = ""
    help = ""

    def prepare_parser(self, parser: ArgumentParser) -> None:
        raise NotImplementedError

    def run(self, args: argparse.Namespace) -> int:
        raise NotImplementedError


# Command name -> its module and class. Only the command that runs is imported: the
# others' imports would delay bcc's compile, and start-up is timed to probes live.
REGISTRY = {
    "trace": ("trace", "TraceCommand"),
    "decode-leak-info": ("decode_leak_info", "DecodeLeakInfoCommand"),
    "heap": ("heap", "HeapCommand"),
}


def load_command(name: str) -> Command:
    module, cls = REGISTRY[name]
    return getattr(importlib.import_module(f".{module}", __name__), cls)()


DEFAULT_COMMAND = "trace"
