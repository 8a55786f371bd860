"""Putting the in-process library into a running process and taking it out again: a python3
that imported many extension modules (each an executable mapping), with 8 threads
allocating all along. Run as root:

    sudo .venv/bin/python bench/attach_bench.py [--rounds 5]

Prints the process's executable mappings, and per round the seconds the attach (remote
dlopen and GOT patching, leaktrace_attach) and the detach took.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from leaktrace.platform.process import MapsFollower, read_process
from leaktrace.sources.preload.inject import Injection

TARGET = r"""
import threading, time, sys
import ssl, sqlite3, ctypes, json, decimal, hashlib, zlib, bz2, lzma, csv, array, select
import socket, struct, math, cmath, binascii, unicodedata, mmap, fcntl, termios, resource
import grp, pwd, readline, curses, xml.etree.ElementTree, pyexpat, queue, _asyncio, uuid
try:
    import lxml.etree, numpy
except ImportError:
    pass
def churn():
    while True:
        [bytes(100 + i) for i in range(200)]
        time.sleep(0.001)
for _ in range(8):
    threading.Thread(target=churn, daemon=True).start()
print("ready", flush=True)
time.sleep(3600)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    target = subprocess.Popen(["/usr/bin/python3", "-c", TARGET], stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline() == "ready\n"
        maps = MapsFollower()
        maps.follow(read_process(target.pid).maps)
        print(f"pid {target.pid}: {len(maps.executable)} executable mappings, 8 threads allocating")
        attach_times, detach_times = [], []
        for _ in range(rounds):
            started = time.perf_counter()
            injection = Injection(target.pid, "backtrace=16")
            attach_times.append(time.perf_counter() - started)
            time.sleep(0.5)
            started = time.perf_counter()
            injection.detach()
            detach_times.append(time.perf_counter() - started)
        print(f"attach s: median {statistics.median(attach_times):.4f}, max {max(attach_times):.4f}")
        print(f"detach s: median {statistics.median(detach_times):.4f}, max {max(detach_times):.4f}")
        if target.poll() is not None:
            sys.exit("the target died")
    finally:
        target.kill()
        target.wait()


if __name__ == "__main__":
    main()
