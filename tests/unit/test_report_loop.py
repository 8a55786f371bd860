"""The one report loop: what it hands a consumer and when it ends, on a trace of the test's own;
and that the trace command, the agent and the top view all go through it."""

from __future__ import annotations

import ast
import signal
from pathlib import Path

import pytest

from leaktrace.commands.report_loop import ReportLoop, SignalFlags
from leaktrace.model.snapshot import Counters, Snapshot

SOURCE = Path(__file__).parents[2] / "src" / "leaktrace"


class CountingTrace:
    """Alive for `polls` polls; each snapshot numbered by its allocations counter."""

    exited = False

    def __init__(self, polls: int) -> None:
        self.polls, self.snapshots = polls, 0

    def poll(self) -> bool:
        self.polls -= 1
        return self.polls >= 0

    def snapshot(self, older_than_ms=None, **options) -> Snapshot:
        self.snapshots += 1
        return Snapshot(0.0, (), Counters(allocations=self.snapshots))

    def take_notices(self) -> list[str]:
        return []


class Recorder:
    def __init__(self) -> None:
        self.reports: list[int] = []
        self.dumps: list[int] = []

    def report(self, snapshot: Snapshot) -> None:
        self.reports.append(snapshot.counters.allocations)

    def dump_now(self, snapshot: Snapshot) -> None:
        self.dumps.append(snapshot.counters.allocations)


@pytest.fixture
def flags():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2, signal.SIGCHLD)}
    yield SignalFlags()
    signal.set_wakeup_fd(-1)
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_count_reports_end_the_loop_and_the_last_is_marked(flags):
    lasts: list[bool] = []
    trace = CountingTrace(polls=10_000)

    def take(last: bool) -> Snapshot:
        lasts.append(last)
        return trace.snapshot()

    recorder = Recorder()
    assert ReportLoop(trace, flags, interval=0.001, count=3, take=take).run(recorder)
    assert recorder.reports == [1, 2, 3]
    assert lasts == [False, False, True]


def test_the_targets_end_ends_the_loop_without_count(flags):
    recorder = Recorder()
    assert not ReportLoop(CountingTrace(polls=3), flags, interval=3600).run(recorder, report_first=True)
    assert recorder.reports == [1]  # the first report only: the hour never came


def test_a_dump_request_is_served_once(flags):
    flags.dump = True
    recorder = Recorder()
    ReportLoop(CountingTrace(polls=5), flags, interval=3600).run(recorder)
    assert recorder.dumps == [1] and recorder.reports == []


def test_a_stop_signal_and_the_consumers_word_end_the_loop(flags):
    recorder, waits = Recorder(), []
    loop = ReportLoop(CountingTrace(polls=10_000), flags, interval=3600)
    assert not loop.run(recorder, wait=lambda seconds: waits.append(seconds) or len(waits) < 4)
    assert len(waits) == 4 and all(0 <= seconds <= 3600 for seconds in waits)
    signal.raise_signal(signal.SIGTERM)
    assert flags.stop == signal.SIGTERM
    assert not loop.run(recorder)
    assert recorder.reports == []


def calls_of(path: Path, method: str) -> list[str]:
    """The receivers of every call of .method() in a module, as source text."""
    tree = ast.parse(path.read_text())
    return [
        ast.unparse(node.func.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method
    ]


def test_only_the_report_loop_polls_a_trace_for_the_front_ends():
    front_ends = [*sorted((SOURCE / "commands").glob("*.py")), *sorted((SOURCE / "outputs").glob("*.py"))]
    polling = {path.name for path in front_ends if any("trace" in receiver for receiver in calls_of(path, "poll"))}
    assert polling == {"report_loop.py"}
    runs = {path.name for path in front_ends if "loop.run" in path.read_text() or "run_loop(" in path.read_text()}
    assert {"trace.py", "agent.py", "top_view.py"} <= runs
