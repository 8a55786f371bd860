"""Programs exec'd under a trace (-f, --all), which the kernel side stops at their first
allocator call until their unwind tables are in (hold_for_tables), and with --leak-check
any process whose blocks are all known in _exit to be judged (exit_stop): a thread of leaktrace's wakes at each one,
does that and continues it; a process of its own (StopRelease) continues them should
leaktrace die first."""

from __future__ import annotations

import contextlib
import ctypes as ct
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from leaktrace.sources.bpf.launch import StopRelease
from leaktrace.sources.bpf.layout import HOLD_AT_EXIT, HOLD_RELEASED, HOLD_WAITING

WAKE_MS = 100  # the longest wait between sweeps of the holds map, should a wakeup be missed
# A hold decided by a program run that began before user space said "no more" lands within this.
LAST_HOLDS_SECONDS = 0.02


class ImageHolds:
    """serve(pid, gen) loads an image's tables, True when it did; judge(pid, gen) judges the
    blocks of one held in _exit (whatever either raises, the process is continued)."""

    def __init__(self, bpf: Any, serve: Callable[[int, int], bool], judge: Callable[[int, int], None]):
        self._bpf = bpf
        self._holds = bpf[b"holds"]
        self._serve = serve
        self._judge = judge
        self.failures: list[str] = []  # what serving met, for the trace's notices
        self.held = 0  # images held so far
        self._release = StopRelease(holds_fd=self._holds.map_fd)
        self._stopping = threading.Event()
        self._woken: list[int] = []  # tgids the wakeups named since the last poll
        bpf[b"hold_wakeups"].open_ring_buffer(self._wake)
        self._thread = threading.Thread(target=self._run, name="leaktrace-holds", daemon=True)
        self._thread.start()

    def _wake(self, ctx: Any, data: Any, size: int) -> int:
        self._woken.append(ct.cast(data, ct.POINTER(ct.c_uint32)).contents.value)
        return 0

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._bpf.ring_buffer_poll(WAKE_MS)
                woken, self._woken = self._woken, []
                self.release_waiting(serve=True, pids=woken or None)
            except Exception as e:  # noqa: BLE001 - the thread must outlive any one failure
                self.failures.append(f"image holds: {e}")
                time.sleep(WAKE_MS / 1000)

    def release_waiting(self, serve: bool, pids: list[int] | None = None) -> None:
        """Continues the held processes (those of pids, or every one), each once its tables are
        loaded (serve). A hold whose tables were loaded is deleted; any other stays, released,
        so that its image is not held again."""
        keys = [ct.c_uint32(pid) for pid in pids] if pids is not None else list(self._holds.keys())
        for key in keys:
            try:
                hold = self._holds[key]
            except KeyError:
                continue
            if hold.state not in (HOLD_WAITING, HOLD_AT_EXIT):
                continue
            pid, served = key.value, False
            try:
                if serve and hold.state == HOLD_AT_EXIT:
                    self._judge(pid, hold.gen)
                    served = True  # it is leaving: nothing to hold it again for
                else:
                    served = serve and self._serve(pid, hold.gen)
            except Exception as e:  # noqa: BLE001 - never a reason to leave it stopped
                what = "leak check" if hold.state == HOLD_AT_EXIT else "unwind tables"
                self.failures.append(f"pid {pid}'s {what}: {e}")
            finally:  # continued first: leaktrace dying in between leaves it to StopRelease
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                self.held += 1
                with contextlib.suppress(KeyError):
                    if served:
                        del self._holds[key]
                    else:
                        hold.state = HOLD_RELEASED
                        self._holds[key] = hold

    def close(self) -> None:
        """After the kernel side stopped taking holds (CTL_HOLDS_OFF): continues what is held."""
        self._stopping.set()
        self._thread.join()
        time.sleep(LAST_HOLDS_SECONDS)
        self.release_waiting(serve=False)
        self._release.release()
