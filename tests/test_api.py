"""The Python API the CLI is built on, used directly."""
from __future__ import annotations

import subprocess

from conftest import uprobe_links
from leaktrace import EngineSettings, Symbolizer, Trace, render_text


def test_launch_wait_symbolize_render(program):
    with Trace.launch([str(program("sites"))], EngineSettings(stack_depth=4)) as trace:
        assert trace.wait(timeout=60)
    snapshot = trace.final_snapshot
    assert trace.exit_status == 0
    assert snapshot.live_allocations == 50 and snapshot.live_bytes == 800
    symbolized = Symbolizer().symbolize(snapshot)
    top = max(snapshot.groups, key=lambda g: g.count)
    assert [f.function for f in symbolized.stack_of(top)][:2] == ["site_d", "main"]
    assert "site_d+0x" in render_text(symbolized)


def test_close_detaches_every_probe(program):
    target = subprocess.Popen([str(program("shapes")), "wait"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert target.stdout.readline() == "ready\n"   # its libc is mapped by now
        before = uprobe_links()
        trace = Trace.attach(target.pid)
        # alloc_enter, alloc_return and free_enter: one link each for libc.
        assert len(uprobe_links() - before) == 3
        trace.close()
        assert uprobe_links() - before == set()
        trace.close()   # a second close is harmless
    finally:
        target.kill()
        target.wait()
