"""The BPF engine's fallbacks for kernel features it does without (kernel_features.py), on this
kernel with LEAKTRACE_FEATURES_OFF naming them: probes attached one by one through perf events
(no uprobe_multi, before 6.6), each running a stub that hands its cookie on (no cookies on
perf links, before 5.15). Counts stay exact from -c and from -p. The thread-id hash that stands
in for task storage (before 5.11) is run on 5.10 itself, in its test VM (kernel_subset.txt):
this kernel's verifier follows that program past its limit."""

from __future__ import annotations

from test_exact_counts import assert_shapes, attached_shapes_report

from helpers import final_report, run_command

OFF = "perf_link_cookie,uprobe_multi"


def test_stub_cookies_keep_command_counts_exact(program, monkeypatch, probes_left_as_found):
    monkeypatch.setenv("LEAKTRACE_FEATURES_OFF", OFF)
    result = run_command(["-c", str(program("shapes")), "--json", "3600"])
    first = result.stderr.splitlines()[0]
    assert "no perf_link_cookie (Linux 5.15)" in first and "no uprobe_multi (Linux 6.6)" in first, first
    report = final_report(result)
    assert_shapes(report)
    assert report["counters"]["unknown_frees"] == 0


def test_stub_cookies_keep_attach_counts_exact(program, monkeypatch, probes_left_as_found):
    monkeypatch.setenv("LEAKTRACE_FEATURES_OFF", OFF)
    report = attached_shapes_report(program)
    assert_shapes(report)
    assert report["counters"]["unknown_frees"] == 7  # made before the attach, freed after it
