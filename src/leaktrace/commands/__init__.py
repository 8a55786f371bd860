"""The CLI's commands: small classes behind one registry.

A command has a name, fills its own argparse parser and runs with the parsed
arguments, returning an exit status. `leaktrace ARGS` with no command name
runs the default command, `trace`.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys

from leaktrace.errors import UsageError


def say(line: str) -> None:
    """One line of leaktrace's own on stderr, flushed at once (it interleaves with the reports)."""
    print(f"leaktrace: {line}", file=sys.stderr, flush=True)


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
    """Reports a usage error as one line (through UsageError) instead of usage text; takes
    valgrind's options that may stand alone or carry a value (`--leak-check`, `--leak-check=full`)
    without letting a bare one swallow the interval after it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # such an option -> the value it has alone, and the values it takes
        self._bare_values: dict[str, tuple[str, tuple[str, ...]]] = {}
        # The option that takes a command line: `-- PROGRAM ARGS` stands for it, as valgrind's
        # `valgrind [options] PROGRAM ARGS` (automake's LOG_COMPILER, meson's --wrapper).
        self.program_options: tuple[str, ...] = ()

    def add_valued_flag(self, flag: str, alone: str, **kwargs) -> None:
        """An option valgrind spells alone, with =VALUE or with VALUE after a space (one of its
        choices, so that a word that is not one stays a word of its own)."""
        self._bare_values[flag] = (alone, tuple(kwargs.get("choices", ())))
        self.add_argument(flag, **kwargs)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        given, joined = list(args or []), list[str]()
        while given:
            arg = given.pop(0)
            if arg in self._bare_values:
                alone, choices = self._bare_values[arg]
                arg = f"{arg}={given.pop(0) if given and given[0] in choices else alone}"
            if arg == "--" and self.program_options:
                if not given:
                    self.error("-- needs the program to run after it")
                if any(word.split("=")[0] in self.program_options for word in joined):
                    self.error(f"the program goes after -- or in {self.program_options[0]}, not both")
                joined += [self.program_options[0], shlex.join(given)]
                break
            joined.append(arg)
        return super().parse_args(joined, namespace)

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
    "completion": ("completion", "CompletionCommand"),
    "agent": ("agent", "AgentCommand"),
    "diff": ("diff", "DiffCommand"),
    "features": ("features", "FeaturesCommand"),
}
# One line each for the top-level help (the commands' modules are not imported for it).
SUMMARIES = {
    "trace": "(the default) trace -p PID, -c CMD or --all and report what stays allocated",
    "heap": "walk a running process's glibc heap once, no probes (--unreachable: leaks in it)",
    "decode-leak-info": "print a get_malloc_leak_info buffer written by --leak-info",
    "completion": 'print a bash or zsh completion script (eval "$(leaktrace completion bash)")',
    "diff": "compare two reports (--json lines or --pprof files) site by site: before, after, change",
    "agent": "trace as a service; serve /metrics (Prometheus), /debug/pprof/heap (pprof), /status over HTTP",
    "features": "the kernel features the BPF engine uses: on or off here, the release that brings each",
}
EXAMPLES = """commands:
{commands}

examples:
  sudo leaktrace -p 1234 10              a report every 10 s of what pid 1234 keeps allocated
  sudo leaktrace -c './server --port 8080' --top 20
  sudo leaktrace -p 1234 --unreachable   also what nothing points to any more (leaked)
  sudo leaktrace -c ./tests --engine preload --json 60 1
  sudo leaktrace --all --comm 'worker.*' --top-view
  sudo leaktrace heap -p 1234 --unreachable
  leaktrace diff before.json after.json  what changed at each site between two --json runs

leaktrace COMMAND --help for a command's own options; docs: README.md and docs/."""


def epilog() -> str:
    return EXAMPLES.format(commands="\n".join(f"  {name:18} {line}" for name, line in SUMMARIES.items()))


def load_command(name: str) -> Command:
    module, cls = REGISTRY[name]
    return getattr(importlib.import_module(f".{module}", __name__), cls)()


DEFAULT_COMMAND = "trace"
