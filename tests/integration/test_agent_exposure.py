"""What the agent serves to whom, and what a hostile local user can cost it: a user who
cannot read a root process's /proc/PID/maps gets none of its stacks, paths or addresses
from /status or /debug/pprof/heap, only its own processes'; /metrics (what /proc shows
everyone) is served to all. Malformed pids are answered 400 without a traceback; 1,000
slow clients of one user hold a bounded number of threads and are dropped after the
request's deadline, while Debian's Prometheus keeps scraping and root keeps reading."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from leaktrace.commands.agent import CONNECTIONS

from conftest import leaktrace_command
from helpers import free_port, pprof_top, prometheus_scraping, wait_for_line

pytestmark = pytest.mark.usefixtures("cpu_hogs")

NOBODY = pwd.getpwnam("nobody")
AS_NOBODY = ["setpriv", f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}", "--clear-groups"]
COUNT, SIZE = 100, 1000
FETCH = """
import sys, urllib.request, urllib.error
try:
    sys.stdout.buffer.write(urllib.request.urlopen(sys.argv[1], timeout=30).read())
except urllib.error.HTTPError as e:
    print(e.code)
    sys.exit(3)
"""


def get(url: str, timeout: float = 30) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def get_as_nobody(url: str) -> bytes:
    result = subprocess.run([*AS_NOBODY, "/usr/bin/python3", "-c", FETCH, url], capture_output=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture
def agent_on_two_users(program):
    """An --all agent on two known_heap programs, one root's and one nobody's, each holding its
    blocks: (URL, root's pid, nobody's pid, the agent)."""
    shared = Path(tempfile.mkdtemp(prefix="leaktrace-agent-"))
    shared.chmod(0o755)
    binary = shared / "known_heap"
    shutil.copy(program("known_heap"), binary)
    binary.chmod(0o755)
    targets = [
        subprocess.Popen([*prefix, str(binary), str(COUNT), str(SIZE)], stdout=subprocess.PIPE, text=True)
        for prefix in ([], AS_NOBODY)
    ]
    port = free_port()
    agent = subprocess.Popen(
        leaktrace_command("agent", "--all", "--comm", "^known_heap$", "--listen", f"127.0.0.1:{port}", "0.3"),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for target in targets:
            assert wait_for_line(target.stdout) == "ready\n"
        watchdog = threading.Timer(60, agent.kill)
        watchdog.start()
        while "serving http://" not in (line := agent.stderr.readline()):
            assert line, "the agent ended"
        watchdog.cancel()
        pids = [t.pid for t in targets]  # setpriv execs the program
        for pid in pids:
            os.kill(pid, signal.SIGUSR1)
        for target in targets:
            assert wait_for_line(target.stdout) == "done\n"
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while {
            p["pid"] for p in json.loads(get(f"{url}/status")).get("processes", []) if p["live_bytes"] >= COUNT * SIZE
        } != set(pids):
            assert time.monotonic() < deadline, "no snapshot with both programs' blocks"
            time.sleep(0.3)
        yield url, pids[0], pids[1], agent
        agent.send_signal(signal.SIGINT)
        _, err = agent.communicate(timeout=60)
        assert agent.returncode == 0 and "Traceback" not in err, err
    finally:
        agent.kill()
        for target in targets:
            target.kill()
            target.wait()
        shutil.rmtree(shared)


def test_a_user_sees_only_its_own_processes_stacks(agent_on_two_users, tmp_path):
    url, roots, nobodys, _ = agent_on_two_users
    everything = json.loads(get(f"{url}/status"))
    assert {p["pid"] for p in everything["processes"]} >= {roots, nobodys}
    seen = json.loads(get_as_nobody(f"{url}/status"))
    assert {p["pid"] for p in seen["processes"]} == {nobodys}
    assert {g["pid"] for g in seen["groups"]} == {nobodys}
    # root's heap profile is empty for nobody, whole for root; nobody's own is whole.
    for pid, who, expected in (
        (roots, "nobody", None),
        (roots, "root", COUNT * SIZE),
        (nobodys, "nobody", COUNT * SIZE),
    ):
        profile = tmp_path / f"{pid}-{who}.pb.gz"
        profile.write_bytes(
            get_as_nobody(f"{url}/debug/pprof/heap?pid={pid}")
            if who == "nobody"
            else get(f"{url}/debug/pprof/heap?pid={pid}")
        )
        assert pprof_top(profile, "inuse_space", tmp_path).get("grow") == expected, (pid, who)
    # /metrics: what /proc shows every user (pids, names, sizes), no address or path.
    metrics = get_as_nobody(f"{url}/metrics").decode()
    assert f'pid="{roots}"' in metrics and "0x7f" not in metrics and 'exe="/' not in metrics


def test_malformed_pids_and_a_thousand_slow_clients_cost_a_bounded_amount(agent_on_two_users, tmp_path):
    url, roots, _, agent = agent_on_two_users
    for pid in ("%C2%B2", "9" * 5000, "-1", "1e3"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            get(f"{url}/debug/pprof/heap?pid={pid}")
        assert refused.value.code == 400
    host, port = url.removeprefix("http://").split(":")
    # nobody opens 1,000 connections and drips a request line a byte every 0.5 s into each.
    dripping = subprocess.Popen(
        [*AS_NOBODY, "/usr/bin/python3", "-c", DRIP, host, port, "1000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    threads = []
    with prometheus_scraping(f"{host}:{port}", tmp_path) as prometheus:
        started = time.monotonic()
        while time.monotonic() - started < 12:
            threads.append(int(Path(f"/proc/{agent.pid}/status").read_text().split("Threads:")[1].split()[0]))
            status = json.loads(get(f"{url}/status", timeout=10))  # root is served throughout
            assert roots in {p["pid"] for p in status["processes"]}
            time.sleep(0.5)
        query = f"{prometheus}?query=up"
        deadline = time.monotonic() + 30
        while not (result := json.loads(get(query))["data"]["result"]) or result[0]["value"][1] != "1":
            assert time.monotonic() < deadline, f"Prometheus could not scrape: {result}"
            time.sleep(0.5)
    out, err = dripping.communicate(timeout=120)
    assert dripping.returncode == 0, err
    answered, dropped_after = json.loads(out)
    # The request line takes 18.5 s to drip: none is answered (a per-read timeout would serve
    # them all), and each is dropped before the drip ends (some wait in the kernel's backlog).
    assert answered == 0
    assert len(dropped_after) == 1000 and max(dropped_after) < 99, sorted(dropped_after)[-10:]
    assert max(threads) <= CONNECTIONS + 8, threads


DRIP = r"""
import json, resource, socket, sys, time
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
line = b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n"
open_since, answered, dropped_after = {}, 0, []
for _ in range(count):
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect((host, port))
    except OSError:
        dropped_after.append(0.0)
        continue
    s.setblocking(False)
    open_since[s] = time.monotonic()
sent = 0
deadline = time.monotonic() + 20
while open_since and time.monotonic() < deadline:
    for s, since in list(open_since.items()):
        try:
            if s.recv(4096):
                answered += 1
            else:
                dropped_after.append(time.monotonic() - since)
            del open_since[s]
            s.close()
            continue
        except BlockingIOError:
            pass
        except OSError:
            dropped_after.append(time.monotonic() - since)
            del open_since[s]
            s.close()
            continue
        if sent < len(line):
            try:
                s.send(line[sent : sent + 1])
            except OSError:
                pass
    sent += 1
    time.sleep(0.5)
dropped_after += [99.0] * len(open_since)  # still open when the drip ended: never dropped
print(json.dumps([answered, dropped_after]))
"""
