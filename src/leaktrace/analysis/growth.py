"""The growth signal: what grew since the last snapshot, and which stacks look like leaks.

A stack (one process, one call stack) is a likely leak when its live bytes
rose in each of the last `intervals` intervals between snapshots; its rate is
the bytes it gained over those intervals divided by their duration. A process's
growth is its change in live bytes since the previous snapshot, and its rate
that change per second. Caches that fill and then stay flat stop being flagged
one interval after they stop growing; a leak that grows slower than once per
interval is not flagged (lengthen the interval).

Sampled snapshots (--sample) hold estimates, which move when a steady stack's blocks are
replaced by others sampled anew. There a stack is a likely leak when its estimate never fell
over the intervals, rose in at least half of them, and rose by more than LEAK_DEVIATIONS
standard deviations of what noise could give: the Poisson variance of the samples it gained
(AllocationGroup.bytes_variance of the newest estimate less the oldest's), plus its churn,
the variance per interval its falls over the last CHURN_STEPS intervals show. A leak's kept
blocks stay kept, so it never falls and stays flagged while it grows by some 16 samples a
window; a steady stack falls as it rises, and its falls measure its noise. A sampled stack is
judged once the tracker has seen twice the window, so that its falls are known.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from leaktrace.model.snapshot import AllocationGroup, Snapshot, StackStatus

# One stack of one process: what the text report and the top view list as a row.
StackId = tuple[int, tuple[int, ...], StackStatus, bool]  # pid, stack, status, inherited
K = TypeVar("K")
LEAK_DEVIATIONS = 4.0  # a sampled stack's rise, in standard deviations, that flags it
CHURN_STEPS = 20  # intervals whose falls measure a sampled stack's churn


def stack_id(group: AllocationGroup) -> StackId:
    return group.pid, group.stack, group.stack_status, group.inherited


def bytes_by(snapshot: Snapshot, key: Callable[[AllocationGroup], K]) -> dict[K, int]:
    """Live bytes of the snapshot's groups, summed per key(group)."""
    totals: dict[K, int] = defaultdict(int)
    for group in snapshot.groups:
        totals[key(group)] += group.bytes
    return dict(totals)


def bytes_by_process(snapshot: Snapshot) -> dict[int, int]:
    return bytes_by(snapshot, lambda group: group.pid)


@dataclass(frozen=True)
class ProcessGrowth:
    delta_bytes: int  # since the previous snapshot
    rate: float  # bytes per second over that interval


@dataclass(frozen=True)
class Growth:
    """What changed between the previous snapshots and the latest one."""

    interval: float = 0.0  # seconds since the previous snapshot
    processes: dict[int, ProcessGrowth] = field(default_factory=dict)
    likely_leaks: dict[StackId, float] = field(default_factory=dict)  # stack -> bytes per second
    intervals: int = 3  # rises needed to flag a stack

    def of_process(self, pid: int) -> ProcessGrowth:
        return self.processes.get(pid, ProcessGrowth(0, 0.0))


def variance_by_stack(snapshot: Snapshot) -> dict[StackId, float]:
    """The variance of each stack's live bytes as estimated from samples (none when exact)."""
    totals: dict[StackId, float] = defaultdict(float)
    if snapshot.sample_rate:
        for group in snapshot.groups:
            totals[stack_id(group)] += group.bytes_variance(snapshot.sample_rate)
    return dict(totals)


def grows(history: list[int], variances: list[float], intervals: int) -> bool:
    """Whether a stack's live bytes grew over the last `intervals` of its history: in each of
    them when exact, beyond sampling's noise when estimated (variances: the window's, oldest
    first)."""
    window = history[-(intervals + 1) :]
    steps = list(zip(window, window[1:]))
    if not any(variances):
        return all(b > a for a, b in steps)
    if any(b < a for a, b in steps) or 2 * sum(b > a for a, b in steps) < len(steps):
        return False
    falls = [min(b - a, 0) for a, b in zip(history, history[1:])]
    churn = 2 * sum(fall * fall for fall in falls) / len(falls) * len(steps)
    gained = max(variances[-1] - variances[0], 0.0)
    return window[-1] - window[0] > LEAK_DEVIATIONS * math.sqrt(gained + churn)


class GrowthTracker:
    """Fed every snapshot in turn; keeps the last `intervals` + 1 of them (as byte totals, and
    their variances when sampled), and CHURN_STEPS more for sampled stacks' churn."""

    def __init__(self, intervals: int = 3):
        self.intervals = intervals
        self._history: deque[tuple[float, dict[StackId, int], dict[int, int], dict[StackId, float]]] = deque(
            maxlen=intervals + 1 + CHURN_STEPS
        )

    def observe(self, snapshot: Snapshot) -> Growth:
        self._history.append(
            (snapshot.taken_at, bytes_by(snapshot, stack_id), bytes_by_process(snapshot), variance_by_stack(snapshot))
        )
        while not snapshot.sample_rate and len(self._history) > self.intervals + 1:
            self._history.popleft()  # exact: the window is all there is to judge
        if len(self._history) < 2:
            return Growth(intervals=self.intervals)
        (before, _, processes_before, _), (now, stacks_now, processes_now, _) = self._history[-2], self._history[-1]
        elapsed = max(now - before, 1e-9)
        processes = {}
        for pid in processes_now.keys() | processes_before.keys():
            delta = processes_now.get(pid, 0) - processes_before.get(pid, 0)
            processes[pid] = ProcessGrowth(delta, delta / elapsed)
        leaks = {}
        window = list(self._history)[-(self.intervals + 1) :]
        judged = 2 * self.intervals + 1 if snapshot.sample_rate else self.intervals + 1
        if len(self._history) >= judged:
            start = window[0][0]
            for key, now_bytes in stacks_now.items():
                history = [stacks.get(key, 0) for _, stacks, _, _ in self._history]
                if grows(history, [variances.get(key, 0.0) for _, _, _, variances in window], self.intervals):
                    leaks[key] = (now_bytes - history[-self.intervals - 1]) / max(now - start, 1e-9)
        return Growth(elapsed, processes, leaks, self.intervals)
