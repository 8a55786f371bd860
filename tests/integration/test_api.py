"""The Python API the CLI is built on, used directly."""

from __future__ import annotations

import subprocess
import time

from leaktrace import BpfTrace, EngineSettings, Symbolizer, render_text
from leaktrace.sources.bpf.compile import compile_ahead
from leaktrace.sources.target import TraceTarget

from conftest import uprobe_links


def test_launch_wait_symbolize_render(program):
    with BpfTrace.launch([str(program("sites"))], EngineSettings(stack_depth=4)) as trace:
        assert trace.wait(timeout=60)
    snapshot = trace.final_snapshot
    assert trace.exit_status == 0
    assert snapshot.live_allocations == 50 and snapshot.live_bytes == 800
    symbolized = Symbolizer().symbolize(snapshot)
    top = max(snapshot.groups, key=lambda g: g.count)
    assert [f.function for f in symbolized.stack_of(top)][:2] == ["site_d", "main"]
    assert "site_d+0x" in render_text(symbolized)


def test_close_detaches_every_probe(program):
    target = subprocess.Popen(
        [str(program("shapes")), "wait"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert target.stdout.readline() == "ready\n"  # its libc is mapped by now
        before = uprobe_links()
        trace = BpfTrace.attach(target.pid)
        # alloc_enter, alloc_return and free_enter: one link each for libc.
        assert len(uprobe_links() - before) == 3
        trace.close()
        assert uprobe_links() - before == set()
        trace.close()  # a second close is harmless
    finally:
        target.kill()
        target.wait()


def test_the_engine_takes_the_compile_started_ahead(program):
    """The CLI starts bcc's compile before it looks at the target; an engine whose flags
    differ would compile again and double the start-up, silently."""
    target = subprocess.Popen([str(program("idle")), "30"])
    try:
        time.sleep(0.2)  # until ld.so has mapped its libc
        settings = EngineSettings(stack_depth=8)
        ahead = compile_ahead(settings, TraceTarget.process(target.pid))
        with BpfTrace.attach(target.pid, settings) as trace:
            assert trace.engine.kernel.bpf is ahead.result()[0]
        # --all: the engine turns fork following on by itself, the flags must still match.
        ahead = compile_ahead(settings, TraceTarget.every_process())
        with BpfTrace.everything(settings) as trace:
            assert trace.engine.kernel.bpf is ahead.result()[0]
    finally:
        target.kill()
        target.wait()


def test_renderer_names_are_the_functions_after_their_modules_are_imported():
    """`from leaktrace import render_json` is the function, even once its module
    (leaktrace.outputs.json_report) has been imported, as the CLI's own imports do."""
    import importlib

    import leaktrace

    for name, module_name in (
        ("render_text", "text"),
        ("render_json", "json_report"),
        ("render_pprof", "pprof"),
        ("render_folded", "folded"),
        ("render_html", "html_page"),
    ):
        module = importlib.import_module(f"leaktrace.outputs.{module_name}")
        assert getattr(leaktrace, name) is getattr(module, name) and callable(getattr(leaktrace, name))
