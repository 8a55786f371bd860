"""--top-view for real: leaktrace in a tmux pane against running C programs, driven
with send-keys and read with capture-pane."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest
from test_systemwide import Workers

PANES = itertools.count()


class Pane:
    """A detached tmux session running one command, which stays open after it ends."""

    def __init__(self, command: list[str], width: int = 160, height: int = 40):
        # A server of its own: a killed server can still be exiting when the next test starts one.
        self.socket = os.path.join(tempfile.gettempdir(), f"leaktrace-test-tmux-{os.getpid()}-{next(PANES)}")
        self.tmux = ["tmux", "-S", self.socket]
        line = f'{shlex.join(command)}; echo "EXIT $?"; sleep 600'
        subprocess.run(
            [*self.tmux, "new-session", "-d", "-s", "view", "-x", str(width), "-y", str(height), line], check=True
        )

    def text(self) -> str:
        return subprocess.run(
            [*self.tmux, "capture-pane", "-p", "-t", "view"], capture_output=True, text=True, check=True
        ).stdout

    def resize(self, width: int, height: int) -> None:
        subprocess.run([*self.tmux, "resize-window", "-t", "view", "-x", str(width), "-y", str(height)], check=True)

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.tmux, "send-keys", "-t", "view", *keys], check=True)

    def flag(self, name: str) -> str:
        return subprocess.run(
            [*self.tmux, "display", "-p", "-t", "view", f"#{{{name}}}"], capture_output=True, text=True, check=True
        ).stdout.strip()

    def wait_for(self, pattern: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.text()
            if re.search(pattern, text, re.M):
                return text
            if time.monotonic() > deadline:
                pytest.fail(f"the screen never showed {pattern!r}:\n{text}")
            time.sleep(0.2)

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], check=False, capture_output=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket)  # tmux leaves it behind


def leaktrace_in_pane(*args: str) -> Pane:
    return Pane([sys.executable, "-m", "leaktrace.cli", *args])


def table_rows(text: str) -> list[tuple[int, str]]:
    """(pid, comm) of the process table, in screen order."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["PID", "COMM"])
    rows = []
    for line in lines[start + 1 :]:
        parts = line.split()
        if len(parts) < 2 or not parts[0].isdigit():
            break
        rows.append((int(parts[0]), parts[1]))
    return rows


def keep_growing(process: subprocess.Popen, stop: threading.Event) -> None:
    """Asks a leak-mode worker for 5 more blocks every 0.3 s."""
    while not stop.is_set() and process.poll() is None:
        process.send_signal(signal.SIGUSR1)
        if not Workers.read_line(process):
            return
        time.sleep(0.3)


@pytest.fixture
def workers(program):
    started = Workers(program("workers"))
    yield started
    started.stop()


def test_top_view_shows_the_leaker_on_top_sorts_and_restores_the_terminal(workers):
    pane = leaktrace_in_pane("--all", "--top-view", "0.5", "--comm", "^workers$", "--growth-intervals", "2")
    stop = threading.Event()
    try:
        pane.wait_for(r"probes live|PID +COMM")
        pane.wait_for(r"PID +COMM")
        assert pane.flag("alternate_on") == "1"
        [churn] = workers.start("churn")
        [leak] = workers.start("leak")
        grower = threading.Thread(target=keep_growing, args=(workers.processes[1], stop), daemon=True)
        grower.start()  # grows in each interval: flagged with "!"
        text = pane.wait_for(rf"^ +{leak} workers .*!")
        rows = table_rows(text)
        assert rows[0] == (leak, "workers") and (churn, "workers") in rows
        assert "leak_site+0x" in text.splitlines()[5]

        pane.keys("n")  # by pid, ascending
        text = pane.wait_for(r"sort pid")
        assert [pid for pid, _ in table_rows(text)] == sorted(pid for pid, _ in table_rows(text))
        pane.keys("r")
        text = pane.wait_for(r"sort pid \(reversed\)")
        assert [pid for pid, _ in table_rows(text)] == sorted((pid for pid, _ in table_rows(text)), reverse=True)

        pane.keys("l")  # back to live bytes; the leaker is selected (first row): its stacks
        pane.wait_for(r"sort live +h: help")
        pane.keys("Enter")
        # tmux may capture a screen half drawn: wait until the frame under the leak's is on it too
        # (not its file name, which the pane's edge cuts off when the checkout's path is long)
        frames = r"^    leak_site\+0x[0-9a-f]+ \(workers\) .*\n    main\+0x"
        text = pane.wait_for(rf"^pid {leak} \(workers\): (?s:.*){frames}")
        assert re.search(r"in \d+ allocations \(1000 x\d+\)  LEAK\? ", text)
        pane.keys("Escape")
        pane.wait_for(r"PID +COMM")

        pane.keys("z")  # only 1000-byte blocks: the churner holds none
        pane.wait_for(r"sizes MIN-MAX:")
        pane.keys("1000-1000", "Enter")
        text = pane.wait_for(r"\[sizes 1000-1000\]")
        assert [pid for pid, _ in table_rows(text)] == [leak]

        pane.resize(70, 12)
        text = pane.wait_for(r"^leaktrace .*h: he")
        assert len(text.splitlines()) <= 12 and max(len(line) for line in text.splitlines()) <= 70
        assert table_rows(text)[0][0] == leak
        pane.resize(160, 40)

        pane.keys("h")
        pane.wait_for(r"leaktrace top view: keys")
        pane.keys("x")
        pane.wait_for(r"PID +COMM")

        pane.keys("q")
        text = pane.wait_for(r"^EXIT 0$")
        assert pane.flag("alternate_on") == "0"
        assert pane.flag("cursor_flag") == "1"
        assert "Traceback" not in text
    finally:
        stop.set()
        pane.close()


def test_top_view_ends_cleanly_on_ctrl_c_sigterm_and_the_targets_exit(workers):
    [leak] = workers.start("leak")
    pane = leaktrace_in_pane("-p", str(leak), "--top-view", "0.5")
    try:
        pane.wait_for(r"PID +COMM")
        workers.processes[0].kill()
        text = pane.wait_for(r"^EXIT 0$")
        assert pane.flag("alternate_on") == "0"
        assert f"pid {leak} exited" in text and "Traceback" not in text
    finally:
        pane.close()
    for stop in ("C-c", "SIGTERM"):
        [leak] = workers.start("leak")
        pane = leaktrace_in_pane("-p", str(leak), "--top-view", "0.5")
        try:
            pane.wait_for(r"PID +COMM")
            if stop == "SIGTERM":
                shell = pane.flag("pane_pid")
                tool = subprocess.run(["pgrep", "-P", shell], capture_output=True, text=True).stdout.split()
                os.kill(int(tool[0]), signal.SIGTERM)
            else:
                pane.keys(stop)
            text = pane.wait_for(r"^EXIT 0$")
            assert pane.flag("alternate_on") == "0" and pane.flag("cursor_flag") == "1"
            assert "Traceback" not in text
            assert re.search(rf"\[\d\d:\d\d:\d\d\] pid {leak} \(workers\): \d+ live bytes", text)  # the final report
        finally:
            pane.close()


def test_top_view_with_the_preload_engine(program):
    """The library's table read in place feeds the same screen; the command's exit ends it."""
    pane = leaktrace_in_pane("-c", f"{program('idle')} 3", "--engine", "preload", "--top-view", "0.3")
    try:
        screen = pane.wait_for(r"keep_some")
        assert re.search(r"^ +\d+ idle +21\.1KiB +5 +0B/s  keep_some\+0x[0-9a-f]+ ", screen, re.M), screen
        text = pane.wait_for(r"^EXIT 0$")
        assert pane.flag("alternate_on") == "0" and "Traceback" not in text
        assert "keep_some" in text  # the final report, printed after the screen is gone
    finally:
        pane.close()
