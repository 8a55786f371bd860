"""What a trace follows: a process that was running (-p), a command the trace started (-c), or
every process (--all)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class TargetKind(enum.Enum):
    PROCESS = "process"  # running before the trace: attached to
    COMMAND = "command"  # started by the trace, held until the probes were live
    EVERY_PROCESS = "every process"  # each from its first allocator call


@dataclass(frozen=True)
class TraceTarget:
    """One process (its pid) or every process (no pid)."""

    kind: TargetKind
    pid: int | None = None
    # Every process of one pid namespace (a container's: --container), as its nsfs file's
    # (device, inode); decided in the kernel. None: every process on the machine.
    pid_namespace: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if (self.pid is None) != (self.kind is TargetKind.EVERY_PROCESS):
            raise ValueError(f"a {self.kind.value} target {'has no' if self.pid is None else 'names no'} pid")
        if self.pid_namespace is not None and self.kind is not TargetKind.EVERY_PROCESS:
            raise ValueError("only a trace of every process is narrowed to a pid namespace")

    @classmethod
    def process(cls, pid: int) -> TraceTarget:
        return cls(TargetKind.PROCESS, pid)

    @classmethod
    def command(cls, pid: int) -> TraceTarget:
        return cls(TargetKind.COMMAND, pid)

    @classmethod
    def every_process(cls, pid_namespace: tuple[int, int] | None = None) -> TraceTarget:
        return cls(TargetKind.EVERY_PROCESS, pid_namespace=pid_namespace)

    @property
    def single_pid(self) -> int:
        """The pid of a one-process target; only code for one process asks (every process: ValueError)."""
        if self.pid is None:
            raise ValueError("a trace of every process has no single pid")
        return self.pid

    @property
    def is_every_process(self) -> bool:
        return self.kind is TargetKind.EVERY_PROCESS

    @property
    def is_command(self) -> bool:
        return self.kind is TargetKind.COMMAND
