"""The test VM's provisioning (scripts/provision_vm.sh, which a machine of one's own runs), run
here with DESTDIR: it installs leaktrace on PATH and a leaking demo service, and
leaktrace --all sees the installed demo leak."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import leaktrace_command
from helpers import TIMEOUT, wait_for_start

REPO = Path(__file__).parents[2]


def test_provisioning_installs_a_demo_that_leaktrace_all_sees_leaking(tmp_path):
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "provision_vm.sh")],
        env={**os.environ, "DESTDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr
    demo = tmp_path / "usr/local/bin/leaky-demo"
    assert os.access(demo, os.X_OK)
    assert os.readlink(tmp_path / "usr/local/bin/leaktrace") == str(REPO / ".venv/bin/leaktrace")
    unit = (tmp_path / "etc/systemd/system/leaky-demo.service").read_text()
    assert "ExecStart=/usr/local/bin/leaky-demo 0" in unit and "WantedBy=multi-user.target" in unit

    tool = subprocess.Popen(
        leaktrace_command("--all", "--json", "1", "3", "--comm", "^leaky-demo$"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert "probes live" in wait_for_start(tool.stderr)
    service = subprocess.Popen([str(demo), "0"])
    try:
        out, err = tool.communicate(timeout=TIMEOUT)
    finally:
        service.kill()
        service.wait()
    assert tool.returncode == 0, err
    last = [json.loads(line) for line in out.splitlines()][-1]
    assert [p["pid"] for p in last["processes"]] == [service.pid]
    functions = {g["frames"][0]["function"] for g in last["groups"] if g["frames"]}
    assert {"cache_insert", "render_response"} <= functions
    cache = sum(g["count"] for g in last["groups"] if g["frames"] and g["frames"][0]["function"] == "cache_insert")
    assert cache >= 20  # ten entries a second, never freed
