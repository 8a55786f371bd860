"""The agent over a compressed soak: `leaktrace agent --all` under process churn (short
processes started as fast as bench/churn.c can, PARALLEL at a time) for MINUTES, scraped
like Prometheus would (/metrics every 2 s, /debug/pprof/heap every 10 s). Prints, each
minute, the agent's RSS and the share of one core it used over that minute, and the
scrapes that failed or took over a second. Run as root from the repo:

    sudo .venv/bin/python bench/agent_soak.py [--minutes 10] [--parallel 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from churn_bench import cpu_seconds, rss_mib  # bench/: the directory Python starts this script from
from services import free_port

HERE = Path(__file__).parent


def scrape(url: str, stop: threading.Event, slow: list[str]) -> None:
    """GETs /metrics every 2 s and the heap profile every 10 s until stopped."""
    tick = 0
    while not stop.wait(2):
        for path in ["/metrics"] + (["/debug/pprof/heap"] if tick % 5 == 0 else []):
            started = time.monotonic()
            try:
                urllib.request.urlopen(url + path, timeout=10).read()
            except OSError as e:
                slow.append(f"{path}: {e}")
                continue
            if time.monotonic() - started > 1:
                slow.append(f"{path}: {time.monotonic() - started:.1f} s")
        tick += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=int, default=10)
    parser.add_argument("--parallel", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        churn = Path(directory) / "churn"
        subprocess.run(["gcc", "-O2", "-o", churn, HERE / "churn.c"], check=True)
        port = free_port()
        agent = subprocess.Popen(
            [sys.executable, "-m", "leaktrace.cli", "agent", "--all", "--listen", f"127.0.0.1:{port}", "5"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        while "serving http://" not in (line := agent.stderr.readline()):
            if not line:
                sys.exit("the agent ended")
        load = subprocess.Popen([churn, str(args.minutes * 60), str(args.parallel)], stdout=subprocess.PIPE, text=True)
        stop, slow = threading.Event(), []
        scraper = threading.Thread(target=scrape, args=(f"http://127.0.0.1:{port}", stop, slow))
        scraper.start()
        print(f"{'minute':>6} {'RSS MiB':>8} {'CPU share':>10}")
        last_cpu, last_time = cpu_seconds(agent.pid), time.monotonic()
        for minute in range(1, args.minutes + 1):
            time.sleep(60 - (time.monotonic() - last_time) % 60)
            cpu, now = cpu_seconds(agent.pid), time.monotonic()
            print(f"{minute:>6} {rss_mib(agent.pid):>8.1f} {(cpu - last_cpu) / (now - last_time):>10.2f}", flush=True)
            last_cpu, last_time = cpu, now
        stop.set()
        scraper.join()
        processes = load.communicate()[0].split()[1]
        agent.terminate()
        agent.wait(timeout=60)
        print(f"churn: {processes} processes; scrapes failed or over 1 s: {len(slow)}")
        for line in slow[:10]:
            print(f"  {line}")


if __name__ == "__main__":
    main()
