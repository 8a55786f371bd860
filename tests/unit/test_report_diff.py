"""leaktrace diff: two reports (JSON lines or pprof) compared by site, a site named by its
frames' functions, files and lines (never addresses)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from leaktrace.outputs.pprof import profile_class
from leaktrace.outputs.report_diff import (
    Held,
    UnreadableReport,
    compare,
    diff_to_dict,
    read_sites,
    render_diff_text,
)


def frame(function, line, address=0x1000):
    return {
        "address": address,
        "function": function,
        "offset": 4,
        "module": "/p",
        "file": "p.c",
        "line": line,
        "inlined": False,
        "kind": "native",
    }


def group(pid, size, count, *frames):
    return {"pid": pid, "size": size, "count": count, "bytes": size * count, "frames": list(frames)}


def report_lines(*groups_per_report) -> bytes:
    return "".join(json.dumps({"time": 1.0, "groups": list(groups)}) + "\n" for groups in groups_per_report).encode()


OLD = report_lines(
    [group(1, 16, 9, frame("ignored_first_report", 1))],
    [
        group(10, 64, 3, frame("leak", 12), frame("main", 40)),
        group(11, 32, 1, frame("leak", 12, 0x2000), frame("main", 40)),  # another process, size and address
        group(10, 100, 2, frame("fixed", 20), frame("main", 41)),
        group(10, 8, 5, frame("steady", 30), frame("main", 42)),
    ],
)
NEW = report_lines(
    [
        group(20, 64, 10, frame("leak", 12, 0x7000), frame("main", 40)),
        group(20, 8, 5, frame("steady", 30), frame("main", 42)),
        group(20, 48, 1, frame("appeared", 50), frame("main", 43)),
    ]
)


def test_sites_merge_processes_sizes_and_addresses_and_the_last_report_counts():
    sites = read_sites(OLD)
    assert sites[(("leak", "p.c", 12), ("main", "p.c", 40))] == Held(224, 4)
    assert all(site[0][0] != "ignored_first_report" for site in sites)


def test_changes_sorted_by_bytes_with_new_and_gone_marked():
    changes = compare(read_sites(OLD), read_sites(NEW))
    summary = [(c.site[0][0], c.bytes, c.count, c.status) for c in changes]
    assert summary == [
        ("leak", 640 - 224, 10 - 4, "changed"),
        ("fixed", -200, -2, "gone"),
        ("appeared", 48, 1, "new"),
        ("steady", 0, 0, "same"),
    ]
    text = render_diff_text(changes, "old.json", "new.json", top=2)
    assert (
        text.splitlines()[0]
        == "live: 464 B in 11 blocks (old.json) -> 728 B in 16 blocks (new.json): +264 B, +5 blocks"
    )
    assert text.splitlines()[2].split() == [
        "+416",
        "224",
        "640",
        "+6",
        "4",
        "10",
        *"leak (p.c:12) < main (p.c:40)".split(),
    ]
    assert text.splitlines()[3].endswith("fixed (p.c:20) < main (p.c:41)  [gone]")
    assert "... 1 more sites changed (--top N shows more)" in text and text.endswith("3 sites changed, 1 unchanged\n")
    machine = diff_to_dict(changes, "old.json", "new.json")
    assert [site["status"] for site in machine["sites"]] == ["changed", "gone", "new", "same"]
    assert machine["sites"][0]["change"] == {"bytes": 416, "count": 6}
    assert machine["sites"][0]["frames"][0] == {"function": "leak", "file": "p.c", "line": 12}


def profile_bytes(samples) -> bytes:
    """A pprof profile as leaktrace writes one: samples of (frames innermost first, objects, bytes)."""
    profile = profile_class()()
    strings = ["", "inuse_objects", "count", "inuse_space", "bytes", "p.c"]
    profile.sample_type.add(type=1, unit=2)
    profile.sample_type.add(type=3, unit=4)
    functions: dict[str, int] = {}
    for frames, objects, size in samples:
        sample = profile.sample.add(value=[objects, size])
        for name, line in frames:
            if name not in functions:
                strings.append(name)
                functions[name] = len(functions) + 1
                profile.function.add(id=functions[name], name=len(strings) - 1, filename=5)
            location = profile.location.add(id=len(profile.location) + 1, address=0x1000 + len(profile.location))
            if name != "?":
                location.line.add(function_id=functions[name], line=line)
            sample.location_id.append(location.id)
    profile.string_table.extend(strings)
    return gzip.compress(profile.SerializeToString())


def test_a_pprof_profile_reads_as_the_json_report_of_the_same_sites():
    sites = read_sites(profile_bytes([([("leak", 12), ("main", 40)], 4, 224), ([("?", 0), ("main", 40)], 1, 8)]))
    assert sites == {
        (("leak", "p.c", 12), ("main", "p.c", 40)): Held(224, 4),
        (("?", "", 0), ("main", "p.c", 40)): Held(8, 1),
    }


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not a report\n", "no leaktrace JSON report in it"),
        (b'{"groups": [{"frames": 3}]}\n', "a group is not as leaktrace writes it"),
        (b"\x1f\x8bnot gzip", "not a gzip'd pprof profile"),
        (b"\xff\xfe", "neither JSON text nor a gzip'd profile"),
    ],
)
def test_what_is_not_a_report_is_one_line(data, message):
    with pytest.raises(UnreadableReport, match=message):
        read_sites(data)


def test_the_command_reads_files_and_says_a_bad_one_in_one_line(tmp_path):
    (tmp_path / "old.json").write_bytes(OLD)
    (tmp_path / "new.json").write_bytes(NEW)
    run = [sys.executable, "-m", "leaktrace.cli", "diff"]
    result = subprocess.run(
        run + [str(tmp_path / "old.json"), str(tmp_path / "new.json"), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["sites"][0]["change"] == {"bytes": 416, "count": 6}
    result = subprocess.run(
        run + [str(tmp_path / "old.json"), str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and "cannot read" in result.stderr, result.stderr
