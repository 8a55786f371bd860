"""Programs exec'd under a trace (-f, --all), which the kernel side stops at their first
allocator call until their unwind tables are in (hold_for_tables), and with --leak-check
any process whose blocks are all known in _exit to be judged (exit_stop): a thread of leaktrace's wakes at each one,
does that and continues it; a process of its own (StopRelease) continues them should
leaktrace die first. The woken are served a user at a time, in turn (one process of each
user that has any waiting, then again), so one user's flood of short programs delays
another user's by one process, not by the flood."""

from __future__ import annotations

import collections
import ctypes as ct
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from bcc.libbcc import lib

from leaktrace.abi.layout import HOLD_AT_EXIT, HOLD_RELEASED, HOLD_WAITING
from leaktrace.sources.bpf.launch import StopRelease
from leaktrace.sources.bpf.maps import BPF_EXIST

WAKE_MS = 100  # the longest wait between sweeps of the holds map, should a wakeup be missed
# A hold decided by a program run that began before user space said "no more" lands within this.
LAST_HOLDS_SECONDS = 0.02


def _owner(pid: int) -> int:
    """The uid that owns a process (-1 once it is gone)."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1


class ImageHolds:
    """serve(pid, gen) loads an image's tables; judge(pid, gen) judges the blocks of one held in
    _exit (whatever either raises, the process is continued)."""

    def __init__(
        self,
        bpf: Any,
        serve: Callable[[int, int], None],
        judge: Callable[[int, int], None],
        let_go: Callable[[int], bool],
    ):
        self._bpf = bpf
        self._let_go = let_go  # continues a process unless another leaktrace holds it too
        self._holds = bpf[b"holds"]
        self._serve = serve
        self._judge = judge
        self.failures: list[str] = []  # what serving met, for the trace's notices
        self.held = 0  # images held so far
        self._release = StopRelease(holds_fd=self._holds.map_fd)
        self._stopping = threading.Event()
        self._woken: list[int] = []  # tgids the wakeups named since the last poll
        self._waiting: dict[int, collections.deque[int]] = {}  # uid -> its woken tgids, in order
        bpf[b"hold_wakeups"].open_ring_buffer(self._wake)
        self._thread = threading.Thread(target=self._run, name="leaktrace-holds", daemon=True)
        self._thread.start()

    def _wake(self, ctx: Any, data: Any, size: int) -> int:
        self._woken.append(ct.cast(data, ct.POINTER(ct.c_uint32)).contents.value)
        return 0

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._bpf.ring_buffer_poll(0 if self._waiting else WAKE_MS)
                woken, self._woken = self._woken, []
                for pid in woken:
                    self._waiting.setdefault(_owner(pid), collections.deque()).append(pid)
                turn = [queue.popleft() for queue in self._waiting.values()]
                self._waiting = {uid: queue for uid, queue in self._waiting.items() if queue}
                self.release_waiting(serve=True, pids=turn or None)
            except Exception as e:  # noqa: BLE001 - the thread must outlive any one failure
                self.failures.append(f"image holds: {e}")
                time.sleep(WAKE_MS / 1000)

    def release_waiting(self, serve: bool, pids: list[int] | None = None) -> None:
        """Continues the held processes (those of pids, or every one), each once its tables are
        loaded (serve). Its hold stays, released, so that its image is not held again for its
        tables; it is written before the process runs on, so that the hold it may take next (in
        _exit) is never overwritten."""
        keys = [ct.c_uint32(pid) for pid in pids] if pids is not None else list(self._holds.keys())
        for key in keys:
            try:
                hold = self._holds[key]
            except KeyError:
                continue
            if hold.state not in (HOLD_WAITING, HOLD_AT_EXIT):
                continue
            pid = key.value
            try:
                if serve and hold.state == HOLD_AT_EXIT:
                    self._judge(pid, hold.gen)
                elif serve:
                    self._serve(pid, hold.gen)
            except Exception as e:  # noqa: BLE001 - never a reason to leave it stopped
                what = "leak check" if hold.state == HOLD_AT_EXIT else "unwind tables"
                self.failures.append(f"pid {pid}'s {what}: {e}")
            finally:
                # Released while it is still stopped (only where its hold still is: a killed
                # process's is not made again). Continued after: a SIGKILL of leaktrace between
                # the two leaves it stopped, as StopRelease continues held processes only.
                hold.state = HOLD_RELEASED
                lib.bpf_update_elem(self._holds.map_fd, ct.byref(key), ct.byref(hold), BPF_EXIST)
                self._let_go(pid)
                self.held += 1

    def close(self) -> None:
        """After the kernel side stopped taking holds (CTL_HOLDS_OFF): continues what is held."""
        self._stopping.set()
        self._thread.join()
        time.sleep(LAST_HOLDS_SECONDS)
        self.release_waiting(serve=False)
        self._release.release()
