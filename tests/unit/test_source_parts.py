"""The sources' parts that need neither root nor BPF: the trace target, the shared polling
wait, the engine settings, a command held at its gate, the kernel log's word on a refused
probe; and malloc_debug's record order and merge."""

from __future__ import annotations

import os
import sys

import pytest

from leaktrace.android.records import LeakRecord, android_pcs, merged_records, return_addresses, sorted_records
from leaktrace.model.snapshot import AllocationGroup, Counters, Snapshot
from leaktrace.sources.bpf.launch import reap, spawn_gated
from leaktrace.sources.bpf.links import reference_counter_conflicts
from leaktrace.sources.protocol import PollingSource
from leaktrace.sources.settings import EngineSettings
from leaktrace.sources.target import TargetKind, TraceTarget


def test_a_target_is_one_process_or_every_process_never_a_pid_of_zero():
    assert TraceTarget.process(7) == TraceTarget(TargetKind.PROCESS, 7)
    assert TraceTarget.command(7).is_command and not TraceTarget.process(7).is_command
    every = TraceTarget.every_process()
    assert every.is_every_process and every.pid is None
    with pytest.raises(ValueError):
        TraceTarget(TargetKind.PROCESS)  # a process with no pid
    with pytest.raises(ValueError):
        TraceTarget(TargetKind.EVERY_PROCESS, 1)  # every process, named by one pid


class Ticking(PollingSource):
    def __init__(self, polls: int) -> None:
        self.polls, self.closed = polls, False

    def poll(self) -> bool:
        self.polls -= 1
        return self.polls > 0

    def close(self) -> None:
        self.closed = True


def test_wait_polls_until_the_target_is_gone_or_the_timeout_and_with_closes():
    with Ticking(3) as source:
        assert source.wait(timeout=10) and source.polls == 0
        assert source.take_notices() == []
    assert source.closed
    assert not Ticking(10**9).wait(timeout=0.05)


def test_engine_settings_default_to_exact_whole_stacks_of_every_size():
    settings = EngineSettings()
    assert not settings.sampling.rate and settings.size_min == 0 and not settings.follow_forks
    assert settings.stack_depth > 0


def test_a_gated_command_runs_only_once_the_gate_is_written_and_a_failed_exec_is_said():
    pid, gate, errors = spawn_gated(sys.executable, [sys.executable, "-c", "import sys; sys.exit(5)"])
    assert os.waitpid(pid, os.WNOHANG) == (0, 0)  # held at the gate
    os.write(gate, b"x")
    os.close(gate)
    assert os.read(errors, 512) == b""  # exec'd: the error pipe closed with it
    os.close(errors)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 5
    pid, gate, errors = spawn_gated("/nonexistent/program", ["program"])
    os.write(gate, b"x")
    os.close(gate)
    assert os.read(errors, 512) == os.strerror(2).encode()
    os.close(errors)
    reap(pid, kill=False)
    reap(pid, kill=True)  # gone already: nothing raised


def test_no_refused_probe_is_found_for_an_inode_the_log_never_names():
    assert reference_counter_conflicts(0, [0x1000]) == {}


def test_records_sort_as_bionic_does_and_adjacent_equal_ones_merge():
    snapshot = Snapshot(
        0.0,
        (
            AllocationGroup(1, 16, 2, (0x5001, 0x6001)),
            AllocationGroup(1, 64, 1, (0x5001,)),
            AllocationGroup(2, 8, 1, ()),
        ),
        Counters(),
    )
    records = sorted_records(snapshot, 1)
    assert [record.size for record in records] == [64, 16]  # the largest first
    assert records[1].frames == android_pcs((0x5001, 0x6001)) == (0x5000, 0x6000)
    assert return_addresses(records[1].frames) == (0x5001, 0x6001)
    twice = [LeakRecord(False, 8, (0x5000,)), LeakRecord(False, 8, (0x5000,), 2), LeakRecord(True, 8, (0x5000,))]
    assert [record.num_allocations for record in merged_records(twice)] == [3, 1]
