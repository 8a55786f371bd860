"""leaktrace agent: a real Prometheus (Debian's, started here on 127.0.0.1) scrapes /metrics
and holds a program's exact live bytes; go tool pprof reads /debug/pprof/heap?pid=PID as it
reads a Go program's; the server takes GET only, and a silent client holds nothing."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import stat
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from conftest import leaktrace_command
from helpers import free_port, pprof_top, prometheus_scraping, run_command, wait_for_line

COUNT, SIZE = 100, 1000


def get(url: str, timeout: float = 10) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def snapshot_status(url: str) -> dict | None:
    """/status, or None while the agent has no snapshot yet (503)."""
    try:
        return json.loads(get(f"{url}/status"))
    except urllib.error.HTTPError as e:
        if e.code != 503:
            raise
        return None


@pytest.fixture
def agent_on_known_heap(program):
    """(agent URL, the program's pid) once the program has made its COUNT blocks under the agent."""
    target = subprocess.Popen([program("known_heap"), str(COUNT), str(SIZE)], stdout=subprocess.PIPE, text=True)
    assert wait_for_line(target.stdout) == "ready\n"
    port = free_port()
    agent = subprocess.Popen(
        leaktrace_command("agent", "-p", str(target.pid), "--engine", "bpf", "--listen", f"127.0.0.1:{port}", "0.3"),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        watchdog = threading.Timer(60, agent.kill)  # readline blocks: select cannot see lines already buffered
        watchdog.start()
        while "serving http://" not in (line := agent.stderr.readline()):
            assert line, "the agent ended"
        watchdog.cancel()
        target.send_signal(signal.SIGUSR1)
        assert wait_for_line(target.stdout) == "done\n"
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while (status := snapshot_status(url)) is None or status["live_bytes"] < COUNT * SIZE:
            assert time.monotonic() < deadline, "no snapshot with the blocks"
            time.sleep(0.2)
        yield url, target.pid
        agent.send_signal(signal.SIGINT)
        _, err = agent.communicate(timeout=30)
        assert agent.returncode == 0, err
        assert "Traceback" not in err
    finally:
        agent.kill()
        target.kill()
        target.wait()


def test_prometheus_scrapes_the_exact_live_bytes(agent_on_known_heap, tmp_path):
    url, pid = agent_on_known_heap
    metrics = get(f"{url}/metrics")
    checked = subprocess.run(["promtool", "check", "metrics"], input=metrics, capture_output=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    with prometheus_scraping(url.removeprefix("http://"), tmp_path) as prometheus:
        query = f"{prometheus}?query=leaktrace_live_bytes%7Bpid%3D%22{pid}%22%7D"
        deadline, value = time.monotonic() + 60, None
        while value != COUNT * SIZE:
            assert time.monotonic() < deadline, f"Prometheus has {value!r}"
            time.sleep(0.5)
            try:
                result = json.loads(get(query))["data"]["result"]
            except (urllib.error.URLError, ConnectionError):
                continue  # not up yet
            value = int(float(result[0]["value"][1])) if result else None


def test_go_tool_pprof_reads_the_heap_endpoint(agent_on_known_heap, tmp_path):
    url, pid = agent_on_known_heap
    flat = pprof_top(f"{url}/debug/pprof/heap?pid={pid}", "inuse_space", tmp_path)
    assert flat["grow"] == COUNT * SIZE, flat
    assert pprof_top(f"{url}/debug/pprof/heap?pid={pid}", "inuse_objects", tmp_path)["grow"] == COUNT


def test_the_server_takes_get_only_and_a_silent_client_holds_nothing(agent_on_known_heap):
    url, _ = agent_on_known_heap
    request = urllib.request.Request(f"{url}/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 501
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))):  # connected, says nothing
        started = time.monotonic()
        assert b"leaktrace_live_bytes" in get(f"{url}/metrics", timeout=5)
        assert time.monotonic() - started < 5
    assert b"/debug/pprof/heap" in get(url + "/")


def get_unix(path: str, url_path: str) -> tuple[int, bytes]:
    """A GET over a Unix socket (curl --unix-socket does the same)."""
    connection = http.client.HTTPConnection("localhost", timeout=10)
    connection.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.sock.settimeout(10)
    connection.sock.connect(path)
    connection.request("GET", url_path)
    response = connection.getresponse()
    return response.status, response.read()


def test_the_agent_serves_on_a_unix_socket_of_its_own(program, tmp_path):
    """unix:PATH: a socket made there, root's alone, serving the same endpoints; gone at the end.
    A path that exists already is refused in one line and left as it was."""
    taken = tmp_path / "taken"
    taken.write_text("not ours")
    refused = run_command(["agent", "--all", "--listen", f"unix:{taken}", "1"])
    assert refused.returncode == 2 and refused.stderr.startswith(f"leaktrace: cannot listen on {taken}:")
    assert taken.read_text() == "not ours"

    target = subprocess.Popen([program("known_heap"), str(COUNT), str(SIZE)], stdout=subprocess.PIPE, text=True)
    assert wait_for_line(target.stdout) == "ready\n"
    path = str(tmp_path / "agent.sock")
    agent = subprocess.Popen(
        leaktrace_command("agent", "-p", str(target.pid), "--engine", "bpf", "--listen", f"unix:{path}", "0.3"),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        watchdog = threading.Timer(60, agent.kill)
        watchdog.start()
        while f"serving unix:{path}" not in (line := agent.stderr.readline()):
            assert line, "the agent ended"
        watchdog.cancel()
        assert stat.S_ISSOCK(os.lstat(path).st_mode) and stat.S_IMODE(os.lstat(path).st_mode) == 0o600
        target.send_signal(signal.SIGUSR1)
        assert wait_for_line(target.stdout) == "done\n"
        deadline = time.monotonic() + 30
        while True:
            status, body = get_unix(path, "/status")
            if status == 200 and json.loads(body)["live_bytes"] >= COUNT * SIZE:
                break
            assert time.monotonic() < deadline, (status, body[:200])
            time.sleep(0.2)
        status, metrics = get_unix(path, "/metrics")
        assert status == 200 and b"leaktrace_live_bytes{" in metrics
        agent.send_signal(signal.SIGINT)
        _, err = agent.communicate(timeout=30)
        assert agent.returncode == 0, err
        assert not os.path.lexists(path)
    finally:
        agent.kill()
        target.kill()
        target.wait()
