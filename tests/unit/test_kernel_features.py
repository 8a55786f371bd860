"""The kernel feature table (sources/bpf/kernel_features.py) on the releases the test VMs boot:
what is off, the one start-up line's parts, the refusal where the engine cannot run, and
`leaktrace features`."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from leaktrace.commands.features import FeaturesCommand
from leaktrace.errors import RuntimeFailure
from leaktrace.sources.bpf import kernel_features
from leaktrace.sources.bpf.kernel_features import check_kernel, feature_table, features_off


@pytest.fixture
def release(monkeypatch):
    def running(text: str) -> None:
        real = os.uname()
        fake = os.uname_result((real.sysname, real.nodename, text, real.version, real.machine))
        monkeypatch.setattr(kernel_features.os, "uname", lambda: fake)

    return running


def test_each_test_vms_kernel(release):
    release("6.12.117+deb13-amd64")
    assert features_off() == ["no uprobe_session (Linux 6.13): sampled calls probed at entry and return"]
    check_kernel()
    release("6.1.0-50-amd64")
    assert [line.split(" (")[0] for line in features_off()] == ["no uprobe_multi", "no uprobe_session"]
    assert [line.split(" (")[0] for line in features_off(sampling=False)] == ["no uprobe_multi"]
    check_kernel()
    release("5.10.0-32-amd64")
    assert [line.split(" (")[0] for line in features_off()] == [
        "no task_storage",
        "no perf_link_cookie",
        "no uprobe_multi",
        "no uprobe_session",
    ]
    check_kernel()
    release("5.4.0-200-generic")
    with pytest.raises(RuntimeFailure) as refused:
        check_kernel()
    assert "ringbuf (Linux 5.8)" in str(refused.value)
    assert "--engine preload" in str(refused.value)


def test_features_turned_off_by_name_as_on_an_older_kernel(release, monkeypatch):
    release("6.18.0")
    monkeypatch.setenv("LEAKTRACE_FEATURES_OFF", "task_storage, perf_link_cookie,ringbuf")
    assert [line.split(" (")[0] for line in features_off()] == ["no task_storage", "no perf_link_cookie"]
    check_kernel()  # a feature the engine cannot do without stays on


def test_the_table_lists_every_feature(release):
    release("6.1.0-50-amd64")
    lines = feature_table().splitlines()
    assert lines[0].startswith("kernel 6.1.0-50-amd64") and len(lines) == 2 + len(kernel_features.FEATURES)
    assert any(line.split()[:3] == ["uprobe_multi", "off", "Linux"] for line in lines), lines


def test_leaktrace_features_prints_it(capsys):
    assert FeaturesCommand().run(argparse.Namespace()) == 0
    assert capsys.readouterr().out == feature_table()
    result = subprocess.run([sys.executable, "-m", "leaktrace.cli", "features"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.splitlines()[1].startswith("feature"), result.stderr
