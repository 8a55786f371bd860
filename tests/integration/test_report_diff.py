"""leaktrace diff on two real runs of one program (spike_leak.c) that differ only in how many
blocks leak_site keeps, in both engines: the JSON reports and the pprof profiles name the
leak's site with the exact difference, and go tool pprof -base reads the same from the
profiles."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import leaktrace_command
from helpers import GO, run_command

LEAKS = (100, 300)
LEAK_BYTES = 4096
pytestmark = pytest.mark.usefixtures("cpu_hogs")


def runs(program, tmp_path, engine: str) -> list[tuple[str, str]]:
    """(JSON report file, pprof file) of each run, the smaller leak first."""
    files = []
    for leaks in LEAKS:
        json_file, pprof_file = tmp_path / f"{engine}_{leaks}.json", tmp_path / f"{engine}_{leaks}.pb.gz"
        result = run_command(
            ["-c", f"{program} {leaks}", "--engine", engine, "--json", "--pprof", str(pprof_file), "3600"]
        )
        assert result.returncode == 0, result.stderr
        json_file.write_text(result.stdout)
        files.append((str(json_file), str(pprof_file)))
    return files


def diff(old: str, new: str) -> dict:
    result = subprocess.run(leaktrace_command("diff", old, new, "--json"), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("engine", ["preload", "bpf"])
def test_diff_names_the_leak_with_its_exact_difference(program, tmp_path, engine):
    target = program("spike_leak")
    (old_json, old_pprof), (new_json, new_pprof) = runs(target, tmp_path, engine)
    grown = {"bytes": (LEAKS[1] - LEAKS[0]) * LEAK_BYTES, "count": LEAKS[1] - LEAKS[0]}
    for old, new in ((old_json, new_json), (old_pprof, new_pprof)):
        first = diff(old, new)["sites"][0]
        assert (first["frames"][0]["function"], first["change"], first["status"]) == ("leak_site", grown, "changed")
        assert first["before"] == {"bytes": LEAKS[0] * LEAK_BYTES, "count": LEAKS[0]}
    text = subprocess.run(leaktrace_command("diff", old_json, new_json), capture_output=True, text=True, timeout=60)
    assert text.returncode == 0 and text.stdout.splitlines()[2].split()[:6] == [
        f"+{grown['bytes']:,}",
        f"{LEAKS[0] * LEAK_BYTES:,}",
        f"{LEAKS[1] * LEAK_BYTES:,}",
        f"+{grown['count']}",
        str(LEAKS[0]),
        str(LEAKS[1]),
    ], text.stdout
    top = subprocess.run(
        [GO, "tool", "pprof", "-top", "-nodefraction=0", "-unit=B", "-sample_index=inuse_space", "-base", old_pprof]
        + [new_pprof],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(tmp_path), "PPROF_TMPDIR": str(tmp_path)},
    )
    assert top.returncode == 0, top.stderr
    flat = {line.split()[-1]: line.split()[0] for line in top.stdout.splitlines() if line.strip().endswith("leak_site")}
    assert flat == {"leak_site": f"{grown['bytes']}B"}, top.stdout
