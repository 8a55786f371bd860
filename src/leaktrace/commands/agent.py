"""`leaktrace agent --listen HOST:PORT|unix:PATH`: the trace command's selection (-p PID, --all with
its filters, --engine), run until stopped, serving its latest snapshot over HTTP:
/metrics (Prometheus), /debug/pprof/heap[?pid=PID] (pprof, as a Go program serves it),
/status (the JSON report) and / (an index). Loopback unless an address is named; GET only,
a few seconds per request, and a scrape never waits for the trace (it reads the last
snapshot taken).

Who sees what (platform/peers.py says who a peer is): /metrics carries what /proc shows
every local user (pids, comm, the program's name, sizes) and is served to any peer;
/status and /debug/pprof/heap carry stacks, module paths and code addresses, so a peer
gets only the processes whose /proc/PID/maps it could read itself: all of them for root
(a loopback peer whose socket is root's, the Unix socket's peer, or a peer --listen-allow
names), its own processes for a loopback peer of another uid, none for anyone else. Each
request has REQUEST_SECONDS in all to arrive, and one peer holds at most
CONNECTIONS_PER_PEER threads (CONNECTIONS in all): a connection past either is closed at
once."""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import io
import os
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from leaktrace.errors import UsageError
from leaktrace.outputs.renderers import RENDERERS, RenderContext, Report
from leaktrace.platform.peers import Peer, Visibility, allowed_network, peer_of

from . import ArgumentParser, Command, say
from .engines import ENGINES
from .report_loop import ReportLoop, SignalFlags
from .trace_arguments import add_trace_arguments, check_combinations, engine_settings, malloc_debug_config

REQUEST_SECONDS = 5.0  # a request (its line and headers) that has not arrived by then is dropped
CONNECTIONS, CONNECTIONS_PER_PEER = 64, 8
PID_DIGITS = 10  # a pid of more ASCII digits is refused
DEFAULT_SAMPLE = 512 << 10  # -p's default: sampled in-process (Go's and jemalloc's rate)


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


class _DeadlineReader(io.RawIOBase):
    """The request's bytes from the socket while its deadline lasts: a client that drips a
    byte at a time gets no longer in all than one that sends at once."""

    def __init__(self, connection: socket.socket, deadline: float):
        self._connection, self._deadline = connection, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request took too long")
        self._connection.settimeout(left)
        return self._connection.recv_into(buffer)


class BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most CONNECTIONS of them and CONNECTIONS_PER_PEER for one
    peer (a local user's, by its uid; a remote one's, by its address)."""

    daemon_threads = True
    request_queue_size = 128  # connections the kernel queues until they are taken (socketserver's default: 5)

    def __init__(self, *arguments, **options):
        self._open: collections.Counter = collections.Counter()
        self._peers: dict[int, Peer] = {}  # id of an accepted connection -> its peer, while it is served
        self._open_lock = threading.Lock()
        self.refused_connections = 0
        super().__init__(*arguments, **options)

    def process_request(self, request, client_address) -> None:
        peer = peer_of(request, client_address)
        with self._open_lock:
            crowded = sum(self._open.values()) >= CONNECTIONS or self._open[peer.key] >= CONNECTIONS_PER_PEER
            if crowded:
                self.refused_connections += 1
            else:
                self._open[peer.key] += 1
                self._peers[id(request)] = peer
        if crowded:
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def peer(self, request) -> Peer | None:
        with self._open_lock:
            return self._peers.get(id(request))

    def shutdown_request(self, request) -> None:
        with self._open_lock:
            peer = self._peers.pop(id(request), None)
            if peer is not None:
                self._open[peer.key] -= 1
                if self._open[peer.key] <= 0:
                    del self._open[peer.key]
        super().shutdown_request(request)


class TcpServer(BoundedServer):
    allowed: tuple = ()  # --listen-allow's networks


class UnixHTTPServer(BoundedServer):
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


def listening(
    address: tuple[str, int] | str, handler: type[BaseHTTPRequestHandler], allowed: tuple = ()
) -> ThreadingHTTPServer:
    """The server, bound; UsageError (nothing attached yet) when the address cannot be had."""
    try:
        if isinstance(address, str):
            return UnixHTTPServer(address, handler)  # type: ignore[arg-type]
        server = TcpServer(address, handler)
        server.allowed = allowed
        return server
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
        self._bodies: dict[tuple, bytes] = {}  # (path, pid, who may see what) -> the body rendered from latest
        self._rendering = threading.Lock()  # one render at a time: a second scrape of the same URL waits for it

    def report(self, snapshot) -> None:
        started = time.monotonic()
        symbolized = self._symbolizer.symbolize(snapshot)
        growth = self._growth.observe(snapshot)
        with self._lock:
            self.latest = (symbolized, growth, time.monotonic() - started)
            self._bodies = {}

    def body(self, key: tuple, render: Callable[[tuple], bytes], pid: int | None = None) -> bytes:
        """What render makes of the latest snapshot, rendered once per snapshot and key; a
        body for a pid the snapshot does not hold is rendered each time and never kept, so
        requests for any number of pids keep at most one body per traced process."""
        with self._rendering:
            with self._lock:
                latest, bodies = self.latest, self._bodies
            assert latest is not None  # the handler answers 503 until the first snapshot
            if pid is not None and pid not in latest[0].snapshot.processes:
                return render(latest)
            if key not in bodies:
                bodies[key] = render(latest)
            return bodies[key]

    def dump_now(self, snapshot) -> None:
        """SIGUSR2 asks the trace command for a heap dump; the agent has none to write."""

    def read(self):
        with self._lock:
            return self.latest


def _only(symbolized, shown: Callable[[int], bool]):
    """The snapshot with the processes shown() keeps, nothing of the others."""
    snapshot = symbolized.snapshot
    groups = tuple(g for g in snapshot.groups if shown(g.pid))
    processes = {p: info for p, info in snapshot.processes.items() if shown(p)}
    return dataclasses.replace(symbolized, snapshot=dataclasses.replace(snapshot, groups=groups, processes=processes))


def _parsed_pid(text: str) -> int | None:
    """The pid of ?pid=, None when absent; ValueError for anything but up to PID_DIGITS ASCII digits."""
    if not text:
        return None
    if not (text.isascii() and text.isdigit() and len(text) <= PID_DIGITS):
        raise ValueError(text)
    return int(text)


def handler_for(state: AgentState, args: argparse.Namespace) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_SECONDS  # the socket's, for writes; reads have the request's deadline
        server_version = "leaktrace-agent"

        def setup(self) -> None:
            super().setup()
            self.rfile.close()
            self.rfile = io.BufferedReader(_DeadlineReader(self.connection, time.monotonic() + REQUEST_SECONDS))

        def handle(self) -> None:
            with contextlib.suppress(TimeoutError, OSError):
                super().handle()

        def _visible(self) -> Visibility:
            """Which processes' stacks this peer may see."""
            server = self.server
            peer = server.peer(self.request) if isinstance(server, BoundedServer) else None
            if isinstance(server, UnixHTTPServer):
                return Visibility.everything()  # the socket is root's alone
            if peer is not None and (peer.uid == 0 or peer.allowed_by(getattr(server, "allowed", ()))):
                return Visibility.everything()
            if peer is not None and peer.uid is not None:
                return Visibility.of_uid(peer.uid)
            return Visibility.nothing()

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            url = urlparse(self.path)
            latest = state.read()
            if url.path == "/":
                return self._send(200, "text/html; charset=utf-8", INDEX.encode())
            if latest is None:
                return self._send(503, "text/plain", b"no snapshot yet\n")
            symbolized, growth, report_seconds = latest
            if url.path == "/metrics":
                metrics = RENDERERS.metrics
                context = RenderContext(
                    growth, report_seconds, top_processes=args.top_processes or 10, min_bytes=args.min_bytes or 0
                )
                return self._send(200, metrics.media_type, metrics.render(Report(symbolized, context)))
            if url.path == "/debug/pprof/heap":
                try:
                    pid = _parsed_pid(parse_qs(url.query).get("pid", [""])[0])
                except ValueError:
                    return self._send(400, "text/plain", b"pid must be a number\n")
                visible = self._visible()

                def render(latest: tuple) -> bytes:
                    from leaktrace.analysis.growth import Growth

                    processes = latest[0].snapshot.processes
                    chosen = _only(latest[0], lambda p: visible.shows(processes.get(p)) and pid in (None, p))
                    return RENDERERS.pprof.render(
                        Report(chosen, RenderContext(Growth(), time.time() - state.started_at))
                    )

                body = state.body((url.path, pid, visible), render, pid)
                return self._send(200, RENDERERS.pprof.media_type, body)
            if url.path == "/status":
                visible = self._visible()
                shown = _only(symbolized, lambda p: visible.shows(symbolized.snapshot.processes.get(p)))
                return self._send(
                    200, RENDERERS.json.media_type, RENDERERS.json.render(Report(shown, RenderContext(growth)))
                )
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
        parser.add_argument(
            "--listen-allow",
            action="append",
            default=[],
            type=allowed_network,
            metavar="CIDR",
            help="peers (an address or network, repeatable) that may read every process's stacks from "
            "/status and /debug/pprof/heap, as root may; others get only their own processes' (a local "
            "user, by the uid of its socket) or none; /metrics is served to all",
        )
        # -p alone samples in-process (DEFAULT_SAMPLE): whether --engine or --sample was given.
        parser.set_defaults(engine=None, sample=None)

    def run(self, args: argparse.Namespace) -> int:
        sampled_by_default = args.pid is not None and args.engine is None and args.sample is None
        args.engine = args.engine or ("preload" if sampled_by_default else "bpf")
        args.sample = DEFAULT_SAMPLE if sampled_by_default else (args.sample or 0)
        address = listen_address(args.listen)
        config = malloc_debug_config(args)
        settings = engine_settings(args, config)
        check_combinations(args, ENGINES[args.engine])
        flags = SignalFlags()
        state = AgentState(args.growth_intervals)
        server = listening(address, handler_for(state, args), tuple(args.listen_allow))  # before anything is attached
        url = f"unix:{address}" if isinstance(address, str) else f"http://{address[0]}:{address[1]}/"
        serving = threading.Thread(target=server.serve_forever, name="http", daemon=True)
        try:
            trace, what = ENGINES[args.engine].start(args, settings, config)
            with trace:
                if sampled_by_default:
                    say(
                        f"agent: sampling pid {args.pid} in-process, a block every "
                        f"{DEFAULT_SAMPLE >> 10} KiB on average (estimates; --sample 0 or --engine bpf "
                        "records every call)"
                    )
                for line in trace.startup_lines(what, args.verbose):
                    say(line)
                loop = ReportLoop.of_arguments(trace, args, flags)
                loop.report_to(state)  # a first scrape finds a heap, not a 503
                serving.start()
                say(f"serving {url} (metrics, pprof, status)")
                loop.run(state)
        finally:
            if serving.is_alive():
                server.shutdown()
            server.server_close()  # a Unix socket it made goes with it
        return 0
