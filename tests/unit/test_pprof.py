"""The pprof profile of a synthetic snapshot, decoded: sample types, one Location per module
offset whatever process it is in, inlined functions first in a Location's lines, labels."""

from __future__ import annotations

import gzip

from leaktrace import AllocationGroup, Counters, Frame, ProcessInfo, Snapshot, StackStatus, SymbolizedSnapshot
from leaktrace.outputs.pprof import profile_class, render_pprof

SERVER = "/opt/app/bin/server"
FRAMES = {
    # The same return address of one module, loaded at two places in two processes.
    (10, 0x5010): Frame(0x5010, "make_node", 0x10, SERVER, "node.c", 42, module_offset=0x1010),
    (11, 0x9010): Frame(0x9010, "make_node", 0x10, SERVER, "node.c", 42, module_offset=0x1010),
    (10, 0x5020): Frame(0x5020, "main", 0x20, SERVER, "main.c", 7, module_offset=0x1020),
    (11, 0x9020): Frame(0x9020, "main", 0x20, SERVER, "main.c", 7, module_offset=0x1020),
}
INLINED = {(10, 0x5010): (Frame(0x5010, "node_alloc", 0, SERVER, "node.h", 3, inlined=True),)}


def decoded(groups, sample_rate: int = 0):
    snapshot = Snapshot(
        1_700_000_000.0,
        tuple(groups),
        Counters(allocations=9),
        {10: ProcessInfo(10, "server"), 11: ProcessInfo(11, "worker")},
        sample_rate=sample_rate,
    )
    profile = profile_class()()
    profile.ParseFromString(gzip.decompress(render_pprof(SymbolizedSnapshot(snapshot, FRAMES, INLINED), 2.0)))
    return profile


def test_values_labels_and_shared_locations():
    profile = decoded(
        [
            AllocationGroup(10, 64, 3, (0x5010, 0x5020)),
            AllocationGroup(11, 32, 1, (0x9010, 0x9020), inherited=True),
            AllocationGroup(10, 1 << 20, 1, (), StackStatus.FILTERED),
        ]
    )
    text = list(profile.string_table)
    assert [(text[t.type], text[t.unit]) for t in profile.sample_type] == [
        ("alloc_objects", "count"),
        ("alloc_space", "bytes"),
        ("inuse_objects", "count"),
        ("inuse_space", "bytes"),
    ]
    assert text[profile.default_sample_type] == "inuse_space" and profile.period == 1
    assert profile.duration_nanos == 2_000_000_000
    assert [list(sample.value) for sample in profile.sample] == [[0, 0, 1, 1 << 20], [0, 0, 3, 192], [0, 0, 1, 32]]
    big, ours, theirs = profile.sample
    assert (
        list(big.location_id) == [] and {text[label.key]: text[label.str] for label in big.label}["stack"] == "filtered"
    )
    assert list(ours.location_id) == list(theirs.location_id)  # one Location per module offset
    assert len(profile.location) == 2
    functions = {function.id: text[function.name] for function in profile.function}
    first = next(location for location in profile.location if location.id == ours.location_id[0])
    assert [(functions[line.function_id], line.line) for line in first.line] == [("node_alloc", 3), ("make_node", 42)]
    labels = {text[label.key]: (label.num, text[label.str]) for label in theirs.label}
    assert labels["pid"][0] == 11 and labels["comm"][1] == "worker" and labels["inherited"][1] == "true"
    assert labels["bytes"][0] == 32 and "samples" not in labels


def test_a_sampled_snapshot_carries_its_rate_and_each_samples_count():
    profile = decoded([AllocationGroup(10, 64, 8192, (0x5010, 0x5020), samples=1)], sample_rate=512 << 10)
    text = list(profile.string_table)
    assert (text[profile.period_type.type], text[profile.period_type.unit], profile.period) == (
        "space",
        "bytes",
        512 << 10,
    )
    [sample] = profile.sample
    assert {text[label.key]: label.num for label in sample.label}["samples"] == 1
    assert any(text[comment].startswith("drops:") for comment in profile.comment)
