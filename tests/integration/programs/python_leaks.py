"""Leaks from known lines of nested Python functions, through a C call (ctypes' strdup, which
releases the GIL while it runs, and mallocs through libc's GOT: an attach, which hooks GOT
slots, sees it on every interpreter, where a malloc that ctypes took by dlsym before the
attach would not be seen): 3 blocks of 100003 bytes through outer -> nested, 4 of 100019
from a generator, 2 of 100043 in a thread of its own; all the while another thread runs
Python code. argv: the file to write "ready" in once they are made, then "now", or
"on_signal" to wait for SIGUSR1 first (that file reads "waiting\n" meanwhile). Waits for
SIGTERM at the end. Each site's line ends with a comment naming it: the test finds the lines
by those names."""

import ctypes
import signal
import sys
import threading

libc = ctypes.CDLL(None)
libc.strdup.restype = ctypes.c_void_p
libc.strdup.argtypes = [ctypes.c_char_p]
TEXTS = {size: b"x" * (size - 1) for size in (100003, 100019, 100043)}  # strdup mallocs size bytes
kept = []
stop = threading.Event()


def allocate(size):
    kept.append(libc.strdup(TEXTS[size]))  # ALLOCATE


def nested(size, times):
    for _ in range(times):
        allocate(size)  # NESTED


def outer():
    nested(100003, 3)  # OUTER


def produce(count):
    for _ in range(count):
        allocate(100019)  # PRODUCE
        yield


def in_thread():
    nested(100043, 2)  # IN_THREAD


def spin():
    while not stop.is_set():
        sum(range(1000))


def leak_all():
    outer()  # LEAK_ALL
    for _ in produce(4):  # GENERATOR_LOOP
        pass
    worker = threading.Thread(target=in_thread)
    worker.start()
    worker.join()


signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGTERM})
spinner = threading.Thread(target=spin)
spinner.start()
if sys.argv[2] == "on_signal":
    with open(sys.argv[1], "w") as waiting:
        waiting.write("waiting\n")
    signal.sigwait({signal.SIGUSR1})
leak_all()  # MAIN
stop.set()
spinner.join()
with open(sys.argv[1], "w") as ready:
    ready.write("ready\n")
signal.sigwait({signal.SIGTERM})
