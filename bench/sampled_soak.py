"""The agent's default left on: `leaktrace agent -p PID` (sampled in-process at 512 KiB)
attached to Debian's redis under redis-benchmark load, and to bench/leak_later.c, whose
steady working set starts leaking (1 MiB/s by default) after LEAK_AFTER seconds; Debian's
Prometheus scrapes both agents every 5 s. Prints each minute the RSS of the agents and the
services, then:

- redis's throughput while traced, as a ratio to its untraced runs before the attach and
  after the detach (SET and GET, -P 16);
- how long after the leak began `leaktrace_likely_leak` of leak_later first read 1 in
  Prometheus, and whether it stayed 1;
- every sample where a steady process (redis; leak_later before its leak) read 1.

Run as root from the repo:

    sudo .venv/bin/python bench/sampled_soak.py [--minutes 10] [--leak-after 120] [--leak-rate 1048576]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

from churn_bench import rss_mib  # bench/: the directory Python starts this script from
from services import await_port, free_port, redis_benchmark, redis_tests

HERE = Path(__file__).parent
SCRAPE_SECONDS = 5
BASELINE_SECONDS = 30  # the untraced runs before the agents attach (the leak starts after the soak's own LEAK_AFTER)


def agent(pid: int, port: int) -> subprocess.Popen:
    """leaktrace agent -p PID on 127.0.0.1:port, once it serves."""
    process = subprocess.Popen(
        [sys.executable, "-m", "leaktrace.cli", "agent", "-p", str(pid), "--listen", f"127.0.0.1:{port}", "5"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    while "serving http://" not in (line := process.stderr.readline()):
        if not line:
            sys.exit(f"the agent of pid {pid} ended")
    return process


def prometheus(targets: list[str], directory: str) -> tuple[subprocess.Popen, str]:
    """Debian's Prometheus scraping targets every SCRAPE_SECONDS; its query_range URL."""
    port = free_port()
    config = Path(directory, "prometheus.yml")
    listed = ", ".join(f"'{target}'" for target in targets)
    config.write_text(
        f"global:\n  scrape_interval: {SCRAPE_SECONDS}s\nscrape_configs:\n  - job_name: leaktrace\n"
        f"    static_configs:\n      - targets: [{listed}]\n"
    )
    process = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={directory}/data"]
        + [f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    await_port(port, process)
    return process, f"http://127.0.0.1:{port}/api/v1/query_range"


def likely_leak_series(url: str, start: float, end: float) -> dict[str, list[tuple[float, float]]]:
    """comm -> [(time, value)] of leaktrace_likely_leak over [start, end]."""
    query = urllib.parse.urlencode(
        {"query": "leaktrace_likely_leak", "start": start, "end": end, "step": f"{SCRAPE_SECONDS}s"}
    )
    with urllib.request.urlopen(f"{url}?{query}", timeout=30) as response:
        result = json.loads(response.read())["data"]["result"]
    return {series["metric"]["comm"]: [(float(t), float(v)) for t, v in series["values"]] for series in result}


def load(port: int, stop: threading.Event, runs: list[dict[str, float]]) -> None:
    while not stop.is_set():
        runs.append(redis_benchmark(port, 1_000_000))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=int, default=10)
    parser.add_argument("--leak-after", type=int, default=120, help="seconds into the soak")
    parser.add_argument("--leak-rate", type=int, default=1 << 20, help="bytes a second")
    parser.add_argument("--baseline-runs", type=int, default=5)
    args = parser.parse_args()
    redis_tests[:] = ["SET", "GET"]
    with tempfile.TemporaryDirectory() as directory:
        leaky_binary = Path(directory) / "leak_later"
        subprocess.run(["gcc", "-O2", "-g", "-pthread", "-o", leaky_binary, HERE / "leak_later.c"], check=True)
        redis_port = free_port()
        redis = subprocess.Popen(
            ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", ""],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        await_port(redis_port, redis)
        seconds = args.minutes * 60
        # Running through the baselines too: its threads share the two cores with redis.
        leaky = subprocess.Popen(
            [leaky_binary, str(seconds + 600), str(args.leak_after + BASELINE_SECONDS), str(args.leak_rate)],
            stdout=subprocess.PIPE,
            text=True,
        )
        baseline_started = time.monotonic()
        before = [redis_benchmark(redis_port, 1_000_000) for _ in range(args.baseline_runs)]
        time.sleep(max(0.0, BASELINE_SECONDS - (time.monotonic() - baseline_started)))
        ports = free_port(), free_port()
        agents = [agent(redis.pid, ports[0]), agent(leaky.pid, ports[1])]
        scraper, url = prometheus([f"127.0.0.1:{port}" for port in ports], directory)
        started = time.time()
        leak_began: list[float] = []
        threading.Thread(target=lambda: leak_began.append(time.time()) if leaky.stdout.readline() else None).start()
        stop, during = threading.Event(), []
        loader = threading.Thread(target=load, args=(redis_port, stop, during))
        loader.start()
        watched = {"agent(redis)": agents[0].pid, "agent(leak)": agents[1].pid, "redis": redis.pid}
        watched["leak_later"] = leaky.pid
        print(f"{'minute':>6} " + " ".join(f"{name + ' MiB':>17}" for name in watched), flush=True)
        for minute in range(1, args.minutes + 1):
            time.sleep(max(0.0, started + 60 * minute - time.time()))
            print(f"{minute:>6} " + " ".join(f"{rss_mib(pid):>17.1f}" for pid in watched.values()), flush=True)
        stop.set()
        loader.join()
        ended = time.time()
        series = likely_leak_series(url, started, ended)
        for process in agents:
            process.terminate()
            process.wait(timeout=60)
        after = [redis_benchmark(redis_port, 1_000_000) for _ in range(args.baseline_runs)]
        for process in (scraper, leaky, redis):
            process.terminate()
            process.wait(timeout=60)
    untraced = before + after
    for test in redis_tests:
        base = statistics.median(run[test] for run in untraced)
        traced = statistics.median(run[test] for run in during[1:])  # the first began during the attach
        print(f"redis {test}: {traced:,.0f} traced ({len(during) - 1} runs), {base:,.0f} untraced: {traced / base:.3f}")
    began = leak_began[0] if leak_began else None
    leak_points = series.get("leak_later", [])
    flagged = [t for t, value in leak_points if value == 1 and began is not None and t >= began]
    if began is None or not flagged:
        print("the leak was not flagged")
    else:
        after_first = [value for t, value in leak_points if t >= flagged[0]]
        print(
            f"leak flagged {flagged[0] - began:.0f} s after it began; 1 in {sum(after_first):.0f} of "
            f"{len(after_first)} samples since"
        )
    false = [("redis", t) for t, value in series.get("redis-server", []) if value == 1]
    false += [("leak_later", t) for t, value in leak_points if value == 1 and (began is None or t < began)]
    print(f"steady processes flagged: {len(false)} samples {false[:5]}")


if __name__ == "__main__":
    main()
