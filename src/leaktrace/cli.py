"""leaktrace's entry point: picks a command, turns failures into one line and an exit status."""

from __future__ import annotations

import argparse
import os
import resource
import sys

from leaktrace.commands import DEFAULT_COMMAND, REGISTRY, ArgumentParser, epilog, load_command
from leaktrace.errors import LeaktraceError


def _raise_open_file_limit() -> None:
    """Every module file a trace reads stays open while it is cached (addr2line and readelf read
    it by descriptor), and a systemwide trace meets many: the soft limit goes up to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed_version

    try:
        return installed_version("leaktrace")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv in (["--version"], ["-V"]):
        print(f"leaktrace {version()}")
        return 0
    _raise_open_file_limit()
    name = argv[0] if argv and argv[0] in REGISTRY else DEFAULT_COMMAND
    if argv and argv[0] == name:
        argv = argv[1:]
    command = load_command(name)
    prog = "leaktrace" if name == DEFAULT_COMMAND else f"leaktrace {name}"
    parser = ArgumentParser(
        prog=prog,
        description=command.help,
        epilog=epilog() if name == DEFAULT_COMMAND else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )

    try:
        command.prepare_parser(parser)
        if not argv and name == DEFAULT_COMMAND:
            parser.print_usage(sys.stderr)
            print("leaktrace: needs -p PID, -c CMD or --all; leaktrace --help lists every command", file=sys.stderr)
            return 2
        return command.run(parser.parse_args(argv))
    except LeaktraceError as e:
        print(f"leaktrace: {e}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        print("leaktrace: interrupted", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (leaktrace ... | head): stop quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.dup2(devnull, sys.stderr.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
