"""The CLI's commands: small classes behind one registry.

A command has a name, fills its own argparse parser and runs with the parsed
arguments, returning an exit status. `leaktrace ARGS` with no command name
runs the default command, `trace`.
"""
from __future__ import annotations

import argparse

from ..errors import UsageError


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


def registry() -> dict[str, Command]:
    from .decode_leak_info import DecodeLeakInfoCommand
    from .trace import TraceCommand
    commands = [TraceCommand(), DecodeLeakInfoCommand()]
    return {command.name: command for command in commands}


DEFAULT_COMMAND = "trace"
