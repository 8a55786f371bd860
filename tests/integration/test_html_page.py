"""--html FILE: one self-contained page, loaded by headless Chromium (Debian's chromium)
with the network closed to it: the flame graph is drawn, its frames carry the report's
figures, no script error reached the page, and a screenshot is kept as an artifact."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

from helpers import chromium, final_report, run_command

ARTIFACTS = Path(os.environ.get("LEAKTRACE_ARTIFACTS", tempfile.gettempdir())) / "leaktrace-artifacts"


def test_html_flame_graph_draws_the_report(program, tmp_path):
    page = tmp_path / "report.html"
    report = final_report(run_command(["-c", str(program("sites")), "--json", "--html", str(page)]))
    text = page.read_text()
    assert not re.search(r"""<(script|link|img)[^>]+(src|href)=""", text)  # nothing fetched
    dom = chromium(page.as_uri(), "--dump-dom")
    assert 'data-rendered="yes"' in dom and re.search(r'<pre id="errors"></pre>', dom), dom[-3000:]
    assert f"{report['live_bytes']} live bytes in {report['live_allocations']} allocations" in dom
    titles = dict(re.findall(r"<title>([^<:]+): (\d+) bytes in \d+ blocks", dom))
    assert {name: int(titles[name]) for name in ("site_a", "site_b", "site_c", "site_d", "main")} == {
        "site_a": 160,
        "site_b": 160,
        "site_c": 160,
        "site_d": 320,
        "main": 800,
    }
    drawn = re.search(r'<g [^>]*width="([\d.]+)"[^>]*name="site_d"', dom)  # its frame, drawn wide
    assert drawn and float(drawn.group(1)) > 0, dom[-3000:]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "flamegraph.png"
    chromium(page.as_uri(), f"--screenshot={shot}")
    assert shot.stat().st_size > 10_000


def test_html_of_a_family_lists_its_processes(program, tmp_path):
    page = tmp_path / "family.html"
    result = run_command(["-c", str(program("forks")), "-f", "--html", str(page), "3600"])  # one report: all of them
    assert result.returncode == 0, result.stderr
    dom = chromium(page.as_uri(), "--dump-dom")
    assert 'data-rendered="yes"' in dom and "<h2>Processes</h2>" in dom and "[inherited]" in dom


def test_html_of_the_demo_for_the_readme(tmp_path):
    """The demo as scripts/demo.sh builds it (-O2, no frame pointers): its leaking sites are
    drawn; the screenshot is the README's (docs/flamegraph.png is copied from this artifact)."""
    demo, page = tmp_path / "leaky-demo", tmp_path / "demo.html"
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-g",
            "-pthread",
            "-o",
            str(demo),
            str(Path(__file__).parents[2] / "scripts" / "demo" / "leaky.c"),
        ],
        check=True,
    )
    result = run_command(["-c", f"{demo} 10", "--html", str(page)])
    assert result.returncode == 0, result.stderr
    dom = chromium(page.as_uri(), "--dump-dom")
    assert 'data-rendered="yes"' in dom and '<pre id="errors"></pre>' in dom
    assert 'name="render_response"' in dom and 'name="cache_insert"' in dom
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    chromium(page.as_uri(), f"--screenshot={ARTIFACTS / 'demo-flamegraph.png'}")


def test_html_lists_unreachable_leaks_with_what_they_hold():
    """The unreachable section: each leak, its size, and the bytes reachable only through it."""
    from leaktrace import Counters, ProcessInfo, Snapshot, SymbolizedSnapshot
    from leaktrace.model.snapshot import UnreachableLeak, UnreachableReport
    from leaktrace.outputs.html_page import render_html

    leak = UnreachableLeak(7, 0x5000, 32, 2, 64)
    report = UnreachableReport(7, (leak,), 1, 3, 96, 10, 500, True, 0.001, 0.001, 0)
    snapshot = Snapshot(0.0, (), Counters(), {7: ProcessInfo(7, "chain")}, unreachable=report)
    page = render_html(SymbolizedSnapshot(snapshot, {}))
    assert "<h2>Unreachable memory of pid 7</h2><p>96 bytes in 3 unreachable allocations</p>" in page
    assert "<td>32</td><td>1</td><td>0x5000</td><td>64 bytes in 2</td><td>no stack</td>" in page


def test_a_wheel_built_from_a_clean_checkout_writes_html_pages(program, tmp_path):
    """pip's path, not set-up's: a wheel built from a clean clone carries the flame graph
    library (fetched by the build from the npm registry, with its licences), and leaktrace
    run from that wheel alone writes a page that inlines it."""
    import sys
    import zipfile

    root = Path(__file__).parents[2]
    checkout, wheels, site = tmp_path / "checkout", tmp_path / "wheels", tmp_path / "site"
    subprocess.run(["git", "clone", "-q", str(root), str(checkout)], check=True)
    assert not (checkout / "src/leaktrace/outputs/web/d3.min.js").exists()
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", wheels, checkout], check=True)
    (wheel,) = wheels.glob("leaktrace-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for asset in ("d3.min.js", "d3-flamegraph.umd.min.js", "d3-flamegraph.css", "d3.LICENSE", "d3-flame-graph.LICENSE"):
        assert f"leaktrace/outputs/web/{asset}" in names
    subprocess.run([*pip, "install", "-q", "--no-deps", "--target", site, wheel], check=True)
    page = tmp_path / "page.html"
    result = subprocess.run(
        [sys.executable, "-m", "leaktrace.cli", "-c", str(program("sites")), "--html", str(page), "3600"],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the checkout: the package comes from the wheel's files alone
        env=dict(os.environ, PYTHONPATH=str(site)),
    )
    assert result.returncode == 0, result.stderr
    assert (
        f"{site}/leaktrace"
        in subprocess.run(
            [sys.executable, "-c", "import leaktrace; print(leaktrace.__file__)"],
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(site)),
            cwd=tmp_path,
        ).stdout
    )
    assert "d3-flame-graph" in page.read_text() and "flamegraph" in page.read_text()
