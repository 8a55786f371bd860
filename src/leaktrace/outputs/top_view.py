"""`--top-view`: a full-screen live view like top, of one process or of every process.

The screen is text made by `render_top_screen`, a pure function of the view's
state, a symbolized snapshot and its growth; the view is a consumer of the report
loop, which polls the trace: the view paints each snapshot and reads keys between polls.
"""

from __future__ import annotations

import curses
import dataclasses
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from leaktrace.analysis.growth import Growth, GrowthTracker, stack_id
from leaktrace.analysis.process_table import process_rows, sort_rows
from leaktrace.analysis.symbolize import SymbolizedSnapshot, Symbolizer
from leaktrace.errors import RuntimeFailure
from leaktrace.model.snapshot import Counters, Snapshot
from leaktrace.outputs.text import ranked_stacks, stack_text
from leaktrace.platform.arch import HOST

SORT_BY_KEY = {
    "l": "live",
    "a": "allocs",
    "g": "growth",
    "p": "peak",
    "t": "allocated",
    "s": "short-lived",
    "n": "pid",
    "c": "comm",
}
# sort key -> the column it adds: header, and the row's value as shown
EXTRA_COLUMNS = {
    "peak": ("PEAK", lambda row: human_bytes(row.peak_bytes)),
    "allocated": ("ALLOCATED", lambda row: human_bytes(row.allocated_bytes)),
    "short-lived": ("SHORT", lambda row: str(row.short_lived)),
}
HELP = [
    "leaktrace top view: keys",
    "  l a g       sort by live bytes, live allocations, growth rate",
    "  p t s       sort by peak bytes, bytes allocated since the trace began, short-lived blocks",
    "  n c         sort by pid, comm",
    "  r           reverse the sort (until another sort key is chosen)",
    "  up/down j/k choose a process; Enter shows its top stacks; Esc or Left goes back",
    "  space       pause (the trace goes on; the screen stops changing)",
    "  /           filter processes by a comm regex (empty: no filter)",
    "  z           only sizes in a range, as MIN-MAX, MIN- or -MAX (empty: all sizes)",
    "  h ?         this help (any key closes it)",
    "  q           quit (a final report follows on the terminal)",
    "",
    "A stack is marked LEAK? when its live bytes rose in each of the last N intervals",
    "(--growth-intervals); GROWTH/s is a process's change in live bytes per second",
    "since the previous refresh.",
]


def human_bytes(value: float) -> str:
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{sign}{value:.0f}{unit}" if unit == "B" else f"{sign}{value:.1f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")


@dataclass
class ViewState:
    sort: str = "live"
    reverse: bool = False
    paused: bool = False
    comm_filter: re.Pattern | None = None
    size_range: tuple[int, int] | None = None  # inclusive
    selected: int = 0  # row index in the process table
    detail_pid: int | None = None  # the process whose stacks are shown
    show_help: bool = False
    message: str = ""  # one line at the bottom (errors of a prompt)
    interval: float = 5.0
    rates: dict[str, float] = field(default_factory=dict)  # allocations and frees per second


def parse_size_range(text: str) -> tuple[int, int] | None:
    """'64-512', '64-', '-512' or '' (no range); ValueError on anything else."""
    text = text.strip()
    if not text:
        return None
    low, sep, high = text.partition("-")
    if not sep:
        low = high = text
    low_value = int(low) if low.strip() else 0
    high_value = int(high) if high.strip() else HOST.size_max
    if low_value < 0 or high_value < low_value:
        raise ValueError(text)
    return low_value, high_value


def filtered(symbolized: SymbolizedSnapshot, state: ViewState) -> SymbolizedSnapshot:
    """The snapshot with only the sizes and processes the view's filters keep."""
    snap = symbolized.snapshot
    groups = snap.groups
    processes = snap.processes
    if state.size_range:
        low, high = state.size_range
        groups = tuple(g for g in groups if low <= g.size <= high)
        holding = {g.pid for g in groups}
        processes = {pid: p for pid, p in processes.items() if pid in holding}
    if state.comm_filter:
        processes = {pid: p for pid, p in processes.items() if state.comm_filter.search(p.comm)}
        groups = tuple(g for g in groups if g.pid in processes)
    return dataclasses.replace(symbolized, snapshot=dataclasses.replace(snap, groups=groups, processes=processes))


def _header(snap: Snapshot, growth: Growth, state: ViewState, processes: int) -> list[str]:
    clock = time.strftime("%H:%M:%S", time.localtime(snap.taken_at))
    flags = ["PAUSED"] if state.paused else []
    if state.comm_filter:
        flags.append(f"comm /{state.comm_filter.pattern}/")
    if state.size_range:
        low, high = state.size_range
        flags.append(f"sizes {low}-{high if high < HOST.size_max else ''}")
    total_rate = sum(p.rate for p in growth.processes.values())
    losses = {
        name: value
        for name, value in snap.counters.losses().items()
        if value and name not in ("internal_frees", "nested_calls")
    }
    drops = ", ".join(f"{name} {value}" for name, value in losses.items()) or "none"
    return [
        f"leaktrace {clock}  every {state.interval:g}s  sort {state.sort}{' (reversed)' if state.reverse else ''}"
        + (f"  [{', '.join(flags)}]" if flags else "")
        + "   h: help  q: quit",
        f"processes {processes}  live {human_bytes(snap.live_bytes)} in {snap.live_allocations} allocations  "
        f"growth {human_bytes(total_rate)}/s  likely leaks {len(growth.likely_leaks)}",
        f"allocations {snap.counters.allocations} ({state.rates.get('allocations', 0):.0f}/s)  "
        f"frees {snap.counters.frees} ({state.rates.get('frees', 0):.0f}/s)  drops: {drops}",
        *([warning] if (warning := snap.counters.incompleteness()) else []),
        "",
    ]


def _process_table(symbolized: SymbolizedSnapshot, growth: Growth, state: ViewState) -> list[str]:
    rows = sort_rows(process_rows(symbolized, growth), state.sort, state.reverse)
    leaking = {key[0] for key in growth.likely_leaks}
    # Sorted by a measure beyond live bytes, its column before the top site (80 columns hold one).
    extra = EXTRA_COLUMNS.get(state.sort)
    contained = any(row.container for row in rows)  # the container column only where one is
    lines = [
        f"{'PID':>8} {'COMM':<16} "
        + (f"{'CONTAINER':<12} " if contained else "")
        + f"{'LIVE':>10} {'ALLOCS':>9} {'GROWTH/s':>11}  "
        + (f"{extra[0]:>10} " if extra else "")
        + "TOP SITE"
    ]
    for row in rows:
        mark = "!" if row.pid in leaking else " "
        comm = (row.comm + ("*" if row.exited else ""))[:16]
        container = (row.container.short_id if row.container else "-") if contained else ""
        lines.append(
            f"{row.pid:>8} {comm:<16} "
            + (f"{container:<12} " if contained else "")
            + f"{human_bytes(row.live_bytes):>10} {row.live_allocations:>9} "
            f"{human_bytes(row.growth_rate) + '/s':>11}{mark} "
            + (f"{extra[1](row):>10} " if extra else "")
            + row.top_site
        )
    if not rows:
        lines.append("  (no process holds live allocations)")
    return lines


def _detail(symbolized: SymbolizedSnapshot, growth: Growth, pid: int) -> list[str]:
    snap = symbolized.snapshot
    info = snap.processes.get(pid)
    ranked = ranked_stacks(g for g in snap.groups if g.pid == pid)
    live = sum(g.bytes for gs in ranked for g in gs)
    count = sum(g.count for gs in ranked for g in gs)
    lines = [
        f"pid {info.label if info else f'{pid} (?)'}{' exited' if info and info.exited else ''}: "
        f"{human_bytes(live)} live in {count} allocations, growth "
        f"{human_bytes(growth.of_process(pid).rate)}/s   Esc: back",
        "",
    ]
    for groups in ranked:
        rate = growth.likely_leaks.get(stack_id(groups[0]))
        sizes = ", ".join(f"{g.size} x{g.count}" for g in sorted(groups, key=lambda g: -g.bytes))
        lines.append(
            f"{human_bytes(sum(g.bytes for g in groups))} in {sum(g.count for g in groups)} allocations"
            f" ({sizes}){' inherited' if groups[0].inherited else ''}"
            + (f"  LEAK? {human_bytes(rate)}/s" if rate is not None else "")
        )
        lines.extend("    " + frame for frame in stack_text(symbolized, groups[0], None).splitlines())
    if not ranked:
        lines.append("  (no live allocations)")
    return lines


def render_top_screen(symbolized: SymbolizedSnapshot, growth: Growth, state: ViewState) -> list[str]:
    """The whole screen as lines (the curses loop clips them to the window)."""
    if state.show_help:
        return HELP
    view = filtered(symbolized, state)
    lines = _header(view.snapshot, growth, state, len(view.snapshot.processes))
    if state.detail_pid is not None:
        lines += _detail(view, growth, state.detail_pid)
    else:
        lines += _process_table(view, growth, state)
    if state.message:
        lines.append(state.message)
    return lines


def table_pids(symbolized: SymbolizedSnapshot, growth: Growth, state: ViewState) -> list[int]:
    """The pids of the process table in screen order (for the selection)."""
    return [row.pid for row in sort_rows(process_rows(filtered(symbolized, state), growth), state.sort, state.reverse)]


class _TopView:
    """The curses side of the report loop: each snapshot refreshes the screen, and the waits
    between the loop's polls read keys."""

    TABLE_TOP = 5  # screen line of the first process row (after the header and column titles)

    def __init__(self, screen, interval: float, dump: Callable[[Snapshot], None], growth_intervals: int):
        self.screen = screen
        self.dump_now = dump  # SIGUSR2: the heap dump the trace command writes
        self.state = ViewState(interval=interval)
        self.growth_tracker = GrowthTracker(growth_intervals)
        self.symbolizer = Symbolizer()
        self.symbolized = SymbolizedSnapshot(Snapshot(time.time(), (), Counters()), {})  # until the first poll
        self.growth = Growth()
        self.previous: tuple[float, Counters] | None = None
        curses.set_escdelay(25)  # Esc goes back at once, not after curses' default second
        curses.curs_set(0)
        self.screen.keypad(True)

    def report(self, snapshot: Snapshot) -> None:
        """A refresh (none while paused: the screen stays as it was)."""
        if self.state.paused and self.previous:
            return
        now = time.monotonic()
        if self.previous:
            elapsed = max(now - self.previous[0], 1e-9)
            self.state.rates = {
                name: (getattr(snapshot.counters, name) - getattr(self.previous[1], name)) / elapsed
                for name in ("allocations", "frees")
            }
        self.previous = (now, snapshot.counters)
        self.growth = self.growth_tracker.observe(snapshot)
        self.symbolized = self.symbolizer.symbolize(snapshot)
        self.paint()

    def paint(self) -> None:
        height, width = self.screen.getmaxyx()
        self.screen.erase()
        lines = render_top_screen(self.symbolized, self.growth, self.state)
        for y, line in enumerate(lines[:height]):
            selected = (
                self.state.detail_pid is None and not self.state.show_help and y == self.TABLE_TOP + self.state.selected
            )
            attr = curses.A_REVERSE if selected else (curses.A_BOLD if y in (0, self.TABLE_TOP - 1) else 0)
            try:
                self.screen.addnstr(y, 0, line, width - 1, attr)
            except curses.error:
                pass  # the last cell of the window cannot be written
        self.screen.refresh()

    def prompt(self, question: str) -> str:
        height, width = self.screen.getmaxyx()
        self.screen.move(height - 1, 0)
        self.screen.clrtoeol()
        self.screen.addnstr(height - 1, 0, question, width - 1)
        curses.echo()
        curses.curs_set(1)
        self.screen.timeout(-1)
        try:
            answer = self.screen.getstr(height - 1, min(len(question), width - 2), 200)
        finally:
            curses.noecho()
            curses.curs_set(0)
        return answer.decode(errors="replace")

    def answer(self, key: int) -> bool:
        """Acts on one key; False to quit."""
        state = self.state
        state.message = ""
        if state.show_help:
            state.show_help = False
            return True
        char = chr(key) if 0 <= key < 256 else ""
        pids = table_pids(self.symbolized, self.growth, state)
        if char == "q":
            return False
        if char in ("h", "?"):
            state.show_help = True
        elif char in SORT_BY_KEY:
            state.sort, state.reverse, state.selected = SORT_BY_KEY[char], False, 0
        elif char == "r":
            state.reverse = not state.reverse
        elif char == " ":
            state.paused = not state.paused
        elif key in (curses.KEY_DOWN, ord("j")):
            state.selected = min(state.selected + 1, max(len(pids) - 1, 0))
        elif key in (curses.KEY_UP, ord("k")):
            state.selected = max(state.selected - 1, 0)
        elif key in (curses.KEY_ENTER, 10, 13) and pids and state.detail_pid is None:
            state.detail_pid = pids[min(state.selected, len(pids) - 1)]
        elif key in (27, curses.KEY_LEFT, curses.KEY_BACKSPACE, 127):
            state.detail_pid = None
        elif char == "/":
            text = self.prompt("comm regex: ")
            try:
                state.comm_filter = re.compile(text) if text else None
                state.selected = 0
            except re.error as e:
                state.message = f"not a regular expression: {e}"
        elif char == "z":
            try:
                state.size_range = parse_size_range(self.prompt("sizes MIN-MAX: "))
            except ValueError:
                state.message = "sizes are given as MIN-MAX, MIN- or -MAX (bytes)"
        return True

    def wait(self, seconds: float) -> bool:
        """The loop's pause between polls: a key read (or a resize) ends it; False to quit."""
        self.screen.timeout(int(seconds * 1000))
        key = self.screen.getch()
        if key == curses.KEY_RESIZE:
            curses.update_lines_cols()
        elif key != -1 and not self.answer(key):
            return False
        if key != -1:
            self.paint()
        return True


def run_top_view(
    run_loop: Callable[..., bool], interval: float, dump: Callable[[Snapshot], None], growth_intervals: int = 3
) -> None:
    """Runs the view in the report loop (run_loop) until q, Ctrl-C, SIGTERM or the target's
    exit; the terminal is restored in every case (curses.wrapper also on an exception)."""

    def in_screen(screen) -> None:
        view = _TopView(screen, interval, dump, growth_intervals)
        run_loop(view, view.wait, report_first=True)

    try:
        curses.wrapper(in_screen)
    except curses.error as e:  # a terminal curses cannot drive (TERM unknown, too small)
        raise RuntimeFailure(f"the top view cannot use this terminal: {e}") from None
