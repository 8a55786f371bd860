"""`leaktrace agent --listen HOST:PORT|unix:PATH`: the trace command's selection (-p PID, --all with
its filters, --engine), run until stopped, serving its latest snapshot over HTTP:
/metrics (Prometheus), /debug/pprof/heap[?pid=PID] (pprof, as a Go program serves it),
/status (the JSON report) and / (an index). Loopback unless an address is named; GET only,
a few seconds per request, and a scrape never waits for the trace (it reads the last
snapshot taken)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from leaktrace.errors import UsageError

from . import ArgumentParser, Command
from .engines import ENGINES
from .trace import TraceCommand, _SignalFlags
from .trace_arguments import add_trace_arguments, check_combinations, engine_settings, malloc_debug_config

REQUEST_SECONDS = 5.0  # a client slower than this is dropped


def listen_address(text: str) -> tuple[str, int] | str:
    """(host, port), or the path of a Unix socket (unix:PATH)."""
    if text.startswith("unix:"):
        path = text[len("unix:") :]
        if not path.startswith("/"):
            raise UsageError(f"--listen unix: wants an absolute path, not '{path}'")
        return path
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--listen wants HOST:PORT or unix:PATH, not '{text}'")
    return host.strip("[]"), int(port)


class UnixHTTPServer(ThreadingHTTPServer):
    """HTTP on a Unix socket made for it: nothing may be at the path already (it is never
    replaced), the socket is root's alone (mode 0600), and it is removed at the end if it is
    still the one made."""

    address_family = socket.AF_UNIX
    _made: int | None = None  # the socket's inode, once bound

    @property
    def path(self) -> str:
        return str(self.server_address)

    def server_bind(self) -> None:
        path = self.path
        previous = os.umask(0o177)
        try:
            self.socket.bind(path)  # fails on anything already there
        finally:
            os.umask(previous)
        self._made = os.lstat(path).st_ino
        self.server_name, self.server_port = "localhost", 0

    def server_close(self) -> None:
        super().server_close()
        with contextlib.suppress(OSError):
            if os.lstat(self.path).st_ino == self._made:
                os.unlink(self.path)


def listening(address: tuple[str, int] | str, handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """The server, bound; UsageError (nothing attached yet) when the address cannot be had."""
    try:
        if isinstance(address, str):
            return UnixHTTPServer(address, handler)  # type: ignore[arg-type]
        return ThreadingHTTPServer(address, handler)
    except OSError as e:
        where = address if isinstance(address, str) else f"{address[0]}:{address[1]}"
        raise UsageError(f"cannot listen on {where}: {e.strerror}") from None


class AgentState:
    """The latest snapshot, symbolized, with its growth: written by the trace loop (as a
    report would be), read by the HTTP threads."""

    def __init__(self, growth_intervals: int):
        from leaktrace.analysis.growth import GrowthTracker
        from leaktrace.analysis.symbolize import Symbolizer

        self._symbolizer, self._growth = Symbolizer(), GrowthTracker(growth_intervals)
        self._lock = threading.Lock()
        self.latest: tuple | None = None  # (SymbolizedSnapshot, Growth, seconds the report took), once there is one
        self.started_at = time.time()
        self._bodies: dict[tuple[str, str], bytes] = {}  # (path, query) -> the body rendered from latest
        self._rendering = threading.Lock()  # one render at a time: a second scrape of the same URL waits for it

    def report(self, snapshot) -> None:
        started = time.monotonic()
        symbolized = self._symbolizer.symbolize(snapshot)
        growth = self._growth.observe(snapshot)
        with self._lock:
            self.latest = (symbolized, growth, time.monotonic() - started)
            self._bodies = {}

    def body(self, key: tuple[str, str], render: Callable[[tuple], bytes]) -> bytes:
        """What render makes of the latest snapshot, rendered once per snapshot and key."""
        with self._rendering:
            with self._lock:
                latest, bodies = self.latest, self._bodies
            if key not in bodies:
                assert latest is not None  # the handler answers 503 until the first snapshot
                bodies[key] = render(latest)
            return bodies[key]

    def dump_now(self, snapshot) -> None:
        """SIGUSR2 asks the trace command for a heap dump; the agent has none to write."""

    def read(self):
        with self._lock:
            return self.latest


def _only_pid(symbolized, pid: int):
    snapshot = symbolized.snapshot
    groups = tuple(g for g in snapshot.groups if g.pid == pid)
    processes = {p: info for p, info in snapshot.processes.items() if p == pid}
    return dataclasses.replace(symbolized, snapshot=dataclasses.replace(snapshot, groups=groups, processes=processes))


def handler_for(state: AgentState, args: argparse.Namespace) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_SECONDS  # the socket's: a slow or silent client cannot hold a thread
        server_version = "leaktrace-agent"

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            url = urlparse(self.path)
            latest = state.read()
            if url.path == "/":
                return self._send(200, "text/html; charset=utf-8", INDEX.encode())
            if latest is None:
                return self._send(503, "text/plain", b"no snapshot yet\n")
            symbolized, growth, report_seconds = latest
            if url.path == "/metrics":
                from leaktrace.outputs.metrics import render_metrics

                body = render_metrics(symbolized, growth, args.top_processes or 10, args.min_bytes or 0, report_seconds)
                return self._send(200, "text/plain; version=0.0.4; charset=utf-8", body)
            if url.path == "/debug/pprof/heap":
                from leaktrace.outputs.pprof import render_pprof

                pid = parse_qs(url.query).get("pid", [""])[0]
                if pid and not pid.isdigit():
                    return self._send(400, "text/plain", b"pid must be a number\n")

                def render(latest: tuple) -> bytes:
                    chosen = _only_pid(latest[0], int(pid)) if pid else latest[0]
                    return render_pprof(chosen, time.time() - state.started_at)

                return self._send(200, "application/octet-stream", state.body((url.path, pid), render))
            if url.path == "/status":
                from leaktrace.outputs.json_report import render_json

                return self._send(200, "application/json", render_json(symbolized, growth).encode())
            return self._send(404, "text/plain", b"not found: see /\n")

        def _send(self, status: int, kind: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *arguments) -> None:  # noqa: A002 (http.server's name)
            """Requests are not logged (a scrape every few seconds would fill stderr)."""

    return Handler


INDEX = """<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>leaktrace agent</title></head><body>
<h1>leaktrace agent</h1><ul>
<li><a href="/metrics">/metrics</a>: Prometheus metrics of the traced processes</li>
<li><a href="/debug/pprof/heap">/debug/pprof/heap</a> (<code>?pid=PID</code> for one process): the live heap as a
pprof profile (<code>go tool pprof http://HOST:PORT/debug/pprof/heap</code>)</li>
<li><a href="/status">/status</a>: the latest report as JSON (docs/report.schema.json)</li>
</ul></body></html>
"""


class AgentCommand(Command):
    name = "agent"
    help = (
        "Trace -p PID or --all as a long-running service and serve the live heap over HTTP: /metrics "
        "(Prometheus), /debug/pprof/heap (pprof), /status (JSON)."
    )

    def prepare_parser(self, parser: ArgumentParser) -> None:
        add_trace_arguments(parser)
        parser.add_argument(
            "--listen",
            default="127.0.0.1:9464",
            metavar="HOST:PORT|unix:PATH",
            help="where to serve (default 127.0.0.1:9464; only loopback unless an address is named); "
            "unix:PATH: a Unix socket made there (mode 0600), never one that exists",
        )

    def run(self, args: argparse.Namespace) -> int:
        address = listen_address(args.listen)
        config = malloc_debug_config(args)
        settings = engine_settings(args, config)
        check_combinations(args, ENGINES[args.engine])
        flags = _SignalFlags()
        state = AgentState(args.growth_intervals)
        server = listening(address, handler_for(state, args))  # before anything is attached
        server.daemon_threads = True
        url = f"unix:{address}" if isinstance(address, str) else f"http://{address[0]}:{address[1]}/"
        serving = threading.Thread(target=server.serve_forever, name="http", daemon=True)
        try:
            trace, what = ENGINES[args.engine].start(args, settings, config)
            with trace:
                for line in trace.startup_lines(what, args.verbose):
                    print(f"leaktrace: {line}", file=sys.stderr, flush=True)
                state.report(trace.snapshot())  # a first scrape finds a heap, not a 503
                serving.start()
                print(f"leaktrace: serving {url} (metrics, pprof, status)", file=sys.stderr, flush=True)
                TraceCommand.report_loop(trace, args, state, flags)
        finally:
            if serving.is_alive():
                server.shutdown()
            server.server_close()  # a Unix socket it made goes with it
        return 0
