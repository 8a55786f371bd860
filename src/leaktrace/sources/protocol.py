"""What every trace source gives the trace command and the API: the BPF engine's BpfTrace and
the preload library's PreloadTrace both implement TraceSource (and share PollingSource)."""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

from leaktrace.model.snapshot import UNREACHABLE_LIMIT, LeakCheck, Snapshot, UnreachableReport
from leaktrace.platform.pacing import poll_pause
from leaktrace.sources.target import TraceTarget


@runtime_checkable
class TraceSource(Protocol):
    target: TraceTarget  # a process, a launched command, or every process
    final_snapshot: Snapshot | None  # the last state, read when it exited
    unjudged_why: str  # what can keep a command that exited from its leak check, for the gate's line

    @property
    def pid(self) -> int | None:
        """target.pid: the one process traced (None: every process)."""

    @property
    def leak_check_at_exit(self) -> bool:
        """The final snapshot carries valgrind's leak kinds (asked for when the source started)."""

    @property
    def exited(self) -> bool: ...

    @property
    def exit_status(self) -> int | None:
        """Its exit status, once it has exited (a launched command: TargetLife)."""

    @property
    def target_selected(self) -> bool:
        """False once a choice of processes (-f --comm ...) left the target out."""

    def poll(self) -> bool:
        """Does the source's periodic work; False once the target is gone."""

    def wait(self, timeout: float | None = None) -> bool:
        """Polls until the target exits; False on timeout."""

    def snapshot(self, older_than_ms: int | None = None, with_allocations: bool = False) -> Snapshot:
        """The live allocations now (RuntimeFailure when the source has none to give)."""

    def check_unreachable(self, limit: int = UNREACHABLE_LIMIT) -> UnreachableReport:
        """libmemunreachable's check on the target (frozen for a moment)."""

    def check_leak_kinds(self) -> LeakCheck:
        """valgrind's leak kinds of every block the running target has (frozen for a moment)."""

    def take_notices(self) -> list[str]:
        """Lines for stderr about what the source met since the last call, each said once."""

    def startup_lines(self, what: str, verbose: bool) -> list[str]:
        """What to say on stderr once the source is live (what: how the target is named)."""

    def close(self) -> None:
        """Lets go of the target: nothing of the source stays attached."""

    def __enter__(self) -> TraceSource: ...

    def __exit__(self, *exc: object) -> None: ...


class PollingSource:
    """What both sources do alike: wait by polling, and close at the end of a with block."""

    def poll(self) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            started = time.monotonic()
            if not self.poll():
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(poll_pause(time.monotonic() - started))

    def take_notices(self) -> list[str]:
        return []

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
