"""-f: children are traced with the blocks they inherit; in Android outputs their own blocks carry the zygote bit.

tests/integration/programs/forks.c makes a parent, a child, a grandchild (forked before the
child's copy exists) and a vfork+exec child, with known blocks in each.
"""

from __future__ import annotations

import re
import time

from each import each

from leaktrace import BpfTrace, EngineSettings
from leaktrace.android.leak_info import decode_leak_info

from helpers import reports, run_command

# (size, count, inherited) of each process when it exits.
PARENT = [(111, 3, False), (333, 1, False), (444, 1, False)]
CHILD = [(111, 2, True), (222, 1, True), (555, 1, False), (666, 1, False)]
GRANDCHILD = [(111, 2, True), (222, 1, True), (555, 1, True), (666, 1, True), (777, 1, False)]
EXEC_CHILD = [(888, 1, False)]
FAMILY = {"parent": PARENT, "child": CHILD, "grandchild": GRANDCHILD, "exec child": EXEC_CHILD}


def departures(stdout: str) -> dict[str, int]:
    """Who's who -> pid, each process named by its blocks at exit (it shows them once, in one report)."""
    seen = {}
    for report in reports(stdout):
        for process in report["processes"]:
            if process["exited"]:
                groups = sorted(
                    (g["size"], g["count"], g["inherited"]) for g in report["groups"] if g["pid"] == process["pid"]
                )
                assert process["pid"] not in seen.values(), f"pid {process['pid']} reported twice as exited"
                (name,) = [name for name, shape in FAMILY.items() if shape == groups] or [groups]
                seen[name] = process["pid"]
    return seen


def test_each_process_keeps_what_it_inherited(program):
    result = run_command(["-c", str(program("forks")), "-f", "--json", "0.05"])
    assert result.returncode == 0, result.stderr
    pids = departures(result.stdout)
    assert sorted(pids) == sorted(FAMILY)
    forked = {process["pid"]: process["forked"] for report in reports(result.stdout) for process in report["processes"]}
    assert {name: forked[pid] for name, pid in pids.items()} == {
        "parent": False,
        "child": True,
        "grandchild": True,
        "exec child": False,
    }
    counters = reports(result.stdout)[-1]["counters"]
    assert (counters["allocations"], counters["frees"]) == (10, 5)
    losses = {
        name: value
        for name, value in counters.items()
        if name not in ("allocations", "frees", "nested_calls") and not name.startswith("stacks_truncated") and value
    }
    assert losses == {}
    # The exec'd child's 888 can come before leaktrace has read its new image's maps (README, Limits).
    assert counters["stacks_truncated"] <= 1


def test_children_beyond_the_copy_slots_are_counted(program):
    """8 forks at once: four wait for their copy, the others are traced without inheritance, loudly."""
    result = run_command(["-c", f"{program('forks')} many", "-f", "--json", "0.05"])
    assert result.returncode == 0, result.stderr
    children = {}
    for report in reports(result.stdout):
        for process in report["processes"]:
            if process["exited"]:
                children[process["pid"]] = sorted(
                    (g["size"], g["count"], g["inherited"]) for g in report["groups"] if g["pid"] == process["pid"]
                )
    (parent,) = [pid for pid, groups in children.items() if groups == [(99, 1, False)]]
    del children[parent]
    assert len(children) == 8
    with_block = sum(groups == [(99, 1, True)] for groups in children.values())
    without = sum(groups == [] for groups in children.values())
    assert with_block + without == 8 and with_block >= 4
    assert reports(result.stdout)[-1]["counters"]["inheritance_lost"] == without


def test_children_that_exec_at_once_lose_nothing_they_needed(program):
    """8 forks at once that exec at once: those beyond the copy slots had nothing to inherit
    that their new program could use; inheritance_lost counts children that ran without it."""
    result = run_command(["-c", f"{program('forks')} many_exec", "-f", "--json", "0.05"])
    assert result.returncode == 0, result.stderr
    final = reports(result.stdout)[-1]
    assert final["counters"]["inheritance_lost"] == 0
    own = [g for report in reports(result.stdout) for g in report["groups"] if g["size"] == 888]
    assert len({g["pid"] for g in own}) == 8 and all(not g["inherited"] for g in own)


def test_without_f_only_the_command_is_traced(program):
    result = run_command(["-c", str(program("forks")), "--json", "3600"])
    (report,) = reports(result.stdout)
    assert [p["pid"] for p in report["processes"]] == [report["groups"][0]["pid"]]
    assert sorted((g["size"], g["count"], g["inherited"]) for g in report["groups"]) == PARENT
    assert report["counters"]["allocations"] == 6


def test_zygote_bit_in_buffer_dump_and_leak_log(program, tmp_path):
    buffer_file, prefix = tmp_path / "leak.bin", tmp_path / "heap"
    result = run_command(
        [
            "-c",
            str(program("forks")),
            "-f",
            "--json",
            "--leak-info",
            str(buffer_file),
            "--options",
            f"leak_track backtrace_dump_on_exit backtrace_dump_prefix={prefix}",
            "0.05",
        ]
    )
    pids = departures(result.stdout)
    assert sorted(pids) == sorted(FAMILY), result.stdout + result.stderr
    child = pids["child"]

    entries = decode_leak_info((tmp_path / f"leak.bin.{child}").read_bytes(), 16)
    assert [(e.zygote, e.size, e.num_allocations) for e in entries] == [
        (False, 222, 1),
        (False, 111, 2),
        (True, 666, 1),
        (True, 555, 1),
    ]  # inherited z 0, own z 1
    parent_entries = decode_leak_info(buffer_file.read_bytes(), 16)
    assert sorted((e.size, e.num_allocations) for e in parent_entries) == [(111, 3), (333, 1), (444, 1)]
    assert not any(e.zygote for e in parent_entries)

    dump = (tmp_path / f"heap.{child}.exit.txt").read_text()
    records = [line.split("  bt ")[0] for line in dump.splitlines() if line.startswith("z ")]
    assert records == [
        "z 0  sz      222  num    1",
        "z 0  sz      111  num    2",
        "z 1  sz      666  num    1",
        "z 1  sz      555  num    1",
    ]
    assert "Total memory: 1665\n" in dump

    grandchild_log = [
        line
        for line in result.stderr.splitlines()
        if re.match(r"\+\+\+ forks leaked block of size \d+ at 0x[0-9a-f]+ \(leak \d of 6\)", line)
    ]
    assert len(grandchild_log) == 6, result.stderr
    sizes = [int(line.split()[6]) for line in grandchild_log]
    assert sizes == [666, 555, 222, 111, 111, 777]  # zygote 0 (inherited) first, then size descending


def test_exited_children_leave_nothing_in_the_maps(program):
    with BpfTrace.launch([str(program("forks"))], EngineSettings(follow_forks=True)) as trace:
        trace.wait()
        parent = trace.pid
        assert {g.pid for g in trace.engine.reader.groups()} == {parent}
        assert trace.engine.reader.recorded_pids() == {
            "live": {parent},
            "sites": {parent},
            "procs": {parent},
            "inherits": set(),
            "copy_slots": set(),
            "holds": set(),
        }


def test_children_that_came_and_went_between_polls_keep_their_names(program):
    """No poll while the family lives: the kernel side's comm and the parent's maps stand in."""
    with BpfTrace.launch([str(program("forks"))], EngineSettings(follow_forks=True)) as trace:
        time.sleep(2)  # the whole family runs; the parent waits in its exit stop
        trace.wait()
    processes = trace.final_snapshot.processes
    assert len(processes) == 4
    parent = processes[trace.pid]
    # The parent, the child and the grandchild: the children have the parent's maps as last read.
    forked = [info for info in processes.values() if info.comm == "forks"]
    assert len(forked) == 3 and parent in forked
    assert all(info.exited and info.name == "forks" and str(program("forks")) in info.maps for info in each(forked))
    # The exec child ran /proc/self/exe, which the kernel names "exe": held at its first
    # allocator call for its tables, its own maps were read then.
    (execed,) = [info for info in processes.values() if info not in forked]
    assert (execed.comm, execed.exited) == ("exe", True) and str(program("forks")) in execed.maps
