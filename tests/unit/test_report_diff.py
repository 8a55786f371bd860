"""leaktrace diff: two reports (JSON lines or pprof) compared by site, a site named by its
frames' functions, files and lines (never addresses)."""

from __future__ import annotations

import gzip
import json
import resource
import subprocess
import sys
import zlib

import pytest
from each import each

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
    assert all(site[0][0] != "ignored_first_report" for site in each(sites))


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
        (b'{"groups": [{"frames": 3}]}\n', "group 0 is not as leaktrace writes it"),
        (b'{"groups": ' + b"[" * 100000 + b"]" * 100000 + b"}\n", "line 1 nests deeper than any report"),
        (b'{"groups": [{"frames": [], "bytes": 1e400, "count": 1}]}\n', "group 0's bytes is not a count"),
        (b'{"groups": [{"frames": [], "bytes": NaN, "count": 1}]}\n', "holds NaN, which leaktrace never writes"),
        (b'{"groups": [{"frames": [{"function": "f", "line": "12"}], "bytes": 8, "count": 1}]}\n', "frame 0's line"),
        (b'{"groups": [{"frames": [{"function": 7}], "bytes": 8, "count": 1}]}\n', "frame 0's function is not a name"),
        (b'{"groups": [{"frames": [], "bytes": true, "count": 1}]}\n', "group 0's bytes is not a count"),
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
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "cannot read" in result.stderr, result.stderr


def test_a_gzip_bomb_is_refused_without_unpacking_it_whole():
    """300 MiB of zeros in about 300 KiB: refused past 64 MiB, in bounded memory."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = b"\0" * (1 << 20)
    bomb = b"".join(packer.compress(chunk) for _ in range(300)) + packer.flush()
    assert len(bomb) < 1 << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(UnreadableReport, match="unpacks to more than 64 MiB"):
        read_sites(bomb)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 << 10  # KiB


def test_names_from_a_foreign_report_reach_the_terminal_escaped_and_values_are_never_echoed():
    hostile = {"function": "leak\x1b[2J", "file": "a\x07.c", "line": 3}
    line = json.dumps({"groups": [{"frames": [hostile], "bytes": 8, "count": 1}]})
    sites = read_sites(line.encode() + b"\n")
    text = render_diff_text(compare({}, sites), "old", "new", 10)
    assert "\x1b" not in text and "\x07" not in text and "leak\\x1b[2J (a\\x07.c:3)" in text, text
    secret = b'{"groups": [{"frames": [], "bytes": "my-password-123", "count": 1}]}\n'
    with pytest.raises(UnreadableReport) as refused:
        read_sites(secret)
    assert "my-password" not in str(refused.value)
