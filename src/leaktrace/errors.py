"""The two kinds of failure the CLI reports: one line on stderr and an exit status."""


class LeaktraceError(Exception):
    exit_status = 1


class UsageError(LeaktraceError):
    """Bad command line or option values: exit status 2."""

    exit_status = 2


class RuntimeFailure(LeaktraceError):
    """The trace cannot start or go on (permissions, BPF, target): exit status 1."""

    exit_status = 1
