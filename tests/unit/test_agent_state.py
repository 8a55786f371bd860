"""The agent's rendered bodies: kept once per snapshot and key for the processes the snapshot
holds, never for a pid it does not (10,000 distinct ?pid= values took 39 MB when each was
kept), and ?pid= parsed as up to ten ASCII digits."""

from __future__ import annotations

import pytest

from leaktrace.analysis.symbolize import SymbolizedSnapshot
from leaktrace.commands.agent import AgentState, _parsed_pid
from leaktrace.model.snapshot import Counters, ProcessInfo, Snapshot


def state_with(pids: list[int]) -> AgentState:
    state = AgentState(3)
    snapshot = Snapshot(1.0, (), Counters(), {pid: ProcessInfo(pid) for pid in pids})
    state.latest = (SymbolizedSnapshot(snapshot, {}), None, 0.0)
    return state


def test_bodies_are_kept_only_for_pids_the_snapshot_holds():
    state = state_with([42])
    renders = []

    def render(latest) -> bytes:
        renders.append(1)
        return b"x" * 100

    for pid in range(1, 10_001):
        state.body(("/debug/pprof/heap", pid, None), render, pid)
    assert len(state._bodies) == 1  # pid 42's
    state.body(("/debug/pprof/heap", 42, None), render, 42)
    state.body(("/debug/pprof/heap", None, None), render, None)
    state.body(("/debug/pprof/heap", None, None), render, None)
    assert len(state._bodies) == 2 and len(renders) == 10_001


@pytest.mark.parametrize("text", ["\u00b2", "9" * 5000, "-1", "1e3", " 1", "\u0661"])
def test_a_pid_is_up_to_ten_ascii_digits(text):
    with pytest.raises(ValueError):
        _parsed_pid(text)


def test_pids_parse():
    assert _parsed_pid("") is None and _parsed_pid("123") == 123 and _parsed_pid("4294967295") == 4294967295
