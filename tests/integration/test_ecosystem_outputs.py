"""--pprof and --folded, read by independent readers (go tool pprof; speedscope's own parser,
in Chromium), with figures equal to the JSON report's."""

from __future__ import annotations

import base64
import gzip
import html
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from leaktrace.outputs.pprof import profile_class

from helpers import GO, chromium, final_report, pprof_top, reports, run_command

SPEEDSCOPE = Path(__file__).parents[2] / "build/speedscope/node_modules/speedscope/dist/release/index.html"


def innermost_totals(report: dict) -> tuple[Counter, Counter]:
    """Live bytes and blocks per innermost function, from a JSON report."""
    space, objects = Counter(), Counter()
    for group in report["groups"]:
        name = group["frames"][0]["function"] if group["frames"] else None
        space[name] += group["bytes"]
        objects[name] += group["count"]
    return space, objects


def speedscope_sandwich(folded: Path, tmp_path: Path) -> dict[str, tuple[int, int]]:
    """(total, self) per function, from the table of speedscope's sandwich view (scripts/setup.sh
    installs speedscope), given the file as its command line gives one. The table's rows are
    drawn after the page has loaded; a machine under load may need more virtual time."""
    script = tmp_path / "profile.js"
    content = base64.b64encode(folded.read_bytes()).decode()
    script.write_text(f"speedscope.loadFileFromBase64({json.dumps(folded.name)}, {json.dumps(content)})")
    url = f"{SPEEDSCOPE.as_uri()}#localProfilePath={script}&view=sandwich"
    for budget_ms in (3000, 10000, 30000):
        dom = chromium(url, "--lang=en-US", "--dump-dom", budget_ms=budget_ms)
        rows = re.findall(r"<tr[^>]*>(<td.*?)</tr>", dom)
        if rows:
            break
    table = {}
    for row in rows:
        cells = [html.unescape(re.sub(r"<[^>]+>", "", cell)) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        total, own, name = (cell.split(" (")[0].replace(",", "") if i < 2 else cell for i, cell in enumerate(cells))
        table[name] = (int(total), int(own))
    assert table, dom[-3000:]
    return table


def test_pprof_and_folded_agree_with_the_report(program, tmp_path):
    pprof, folded = tmp_path / "live.pb.gz", tmp_path / "live.folded"
    result = run_command(["-c", str(program("sites")), "--json", "--pprof", str(pprof), "--folded", str(folded)])
    report = final_report(result)
    space, objects = innermost_totals(report)
    assert space == {"site_a": 160, "site_b": 160, "site_c": 160, "site_d": 320}

    assert pprof_top(pprof, "inuse_space", tmp_path) == space
    assert pprof_top(pprof, "inuse_objects", tmp_path) == objects
    traces = subprocess.run(
        [GO, "tool", "pprof", "-traces", str(pprof)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(tmp_path)},
    ).stdout
    assert "site_d" in traces and "main" in traces and "pid:" in traces and "comm:" in traces

    profile = profile_class().FromString(gzip.decompress(pprof.read_bytes()))
    strings = profile.string_table
    assert [(strings[t.type], strings[t.unit]) for t in profile.sample_type] == [
        ("alloc_objects", "count"),
        ("alloc_space", "bytes"),
        ("inuse_objects", "count"),
        ("inuse_space", "bytes"),
    ]
    assert sum(sample.value[3] for sample in profile.sample) == report["live_bytes"]
    assert sum(sample.value[1] for sample in profile.sample) == sum(s["allocated_bytes"] for s in report["sites"])
    assert any(strings[m.build_id] for m in profile.mapping)  # build-ids are carried

    pid = report["processes"][0]["pid"]
    lines = folded.read_text().splitlines()
    assert len(lines) == 4
    by_leaf = Counter()
    for line in lines:
        stack, _, value = line.rpartition(" ")  # flamegraph.pl: the count is the last field
        frames = stack.split(";")
        assert frames[0] == f"sites ({pid})" and frames[-2] == "main" and value.isdigit()
        by_leaf[frames[-1]] += int(value)
    assert by_leaf == space
    sandwich = speedscope_sandwich(folded, tmp_path)
    assert {name: own for name, (_, own) in sandwich.items() if own} == space
    assert sandwich["main"][0] == sandwich[f"sites ({pid})"][0] == report["live_bytes"]


def test_pprof_of_a_family_labels_each_process(program, tmp_path):
    """-f: one profile, every traced process's samples labelled with its pid."""
    pprof = tmp_path / "family.pb.gz"
    result = run_command(["-c", str(program("forks")), "-f", "--json", "--pprof", str(pprof), "0.05"])
    assert result.returncode == 0, result.stderr
    last = reports(result.stdout)[-1]
    profile = profile_class().FromString(gzip.decompress(pprof.read_bytes()))
    strings = profile.string_table
    pids = {label.num for sample in profile.sample for label in sample.label if strings[label.key] == "pid"}
    assert pids == {g["pid"] for g in last["groups"]}
    tags = subprocess.run(
        [GO, "tool", "pprof", "-tags", str(pprof)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert tags.returncode == 0 and "pid" in tags.stdout, tags.stderr


RENDER_AND_READ_BACK = """
import gzip, sys
import google.protobuf
from leaktrace import AllocationGroup, Counters, Frame, ProcessInfo, Snapshot, SymbolizedSnapshot
from leaktrace.outputs.pprof import profile_class, render_pprof
snapshot = Snapshot(1.0, (AllocationGroup(7, 24, 3, (0x10,)),), Counters(allocations=3), {7: ProcessInfo(7, "prog")})
symbolized = SymbolizedSnapshot(snapshot, {(7, 0x10): Frame(0x10, "leak_here", 0x4, "/bin/prog")})
profile = profile_class().FromString(gzip.decompress(render_pprof(symbolized)))
names = [profile.string_table[f.name] for f in profile.function]
print(google.protobuf.__version__, [list(s.value) for s in profile.sample], names)
"""


@pytest.mark.parametrize("version", ["6.33.6", "7.36.2"])
def test_pprof_is_written_with_the_newest_protobuf_too(version, tmp_path):
    """--pprof with protobuf 6 and 7 from PyPI (MessageFactory.GetPrototype is gone there),
    installed into a directory of their own that comes first on the path; Debian's 4.21 is the
    suite's own."""
    packages = tmp_path / "packages"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--target", packages, f"protobuf=={version}"],
        check=True,
        timeout=300,
    )
    source = Path(__file__).parents[2] / "src"
    result = subprocess.run(
        [sys.executable, "-c", RENDER_AND_READ_BACK],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=f"{packages}:{source}"),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == version
    assert "[[0, 0, 3, 72]] ['leak_here']" in result.stdout, result.stdout  # no site totals in it: alloc_* 0
