"""What the trace command writes at each report, on SIGUSR2 and at the target's exit, in
parts, one a job: `OutputFiles` (files written whole, failures counted), `LeakGate` (the
leak checks judged: suppressions, verdict, valgrind XML, JUnit), `AndroidFiles` (each
process's leak info, heap dumps and leak log) and `Reports` (the report on stdout and the
file formats, each an entry of outputs/renderers.py); `Outputs` symbolizes each snapshot once
and hands it to them."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field

from leaktrace.analysis.growth import Growth, GrowthTracker
from leaktrace.analysis.suppressions import LeakCheckSettings, apply_suppressions
from leaktrace.analysis.symbolize import SymbolizedSnapshot, Symbolizer
from leaktrace.android.leak_info import get_malloc_leak_info
from leaktrace.android.options import DEFAULT_DUMP_PREFIX
from leaktrace.errors import RuntimeFailure
from leaktrace.model.snapshot import LeakCheck, LeakKind, Measure, Snapshot
from leaktrace.outputs.junit import GateCase
from leaktrace.outputs.renderers import RENDERERS, Judgement, ProcessView, RenderContext, Renderer, Report
from leaktrace.platform.atomic_write import write_atomically

from . import say

UNWRITTEN_OUTPUT = 3  # exit status: the trace ran to its end, but an output file could not be written


def write_fully(stream, text: str | bytes) -> None:
    """Writes text to a standard stream with os.write until all of it is out. Python's
    buffered writer drops the rest of a large write that a signal interrupts on a full
    pipe (seen with reports of 200 KB and SIGINT), and reports must arrive whole."""
    stream.flush()
    view = memoryview(text.encode() if isinstance(text, str) else text)
    while view:
        view = view[os.write(stream.fileno(), view) :]


class OutputFiles:
    """Files written whole (a temporary file renamed); one that cannot be is said and counted,
    and each path is announced once, not at every report."""

    def __init__(self) -> None:
        self.unwritten = 0
        self._announced: set[str] = set()

    def write(self, path: str, data: bytes, what: str) -> None:
        try:
            write_atomically(path, data)
        except RuntimeFailure as e:
            self.unwritten += 1
            say(str(e))
            return
        if path not in self._announced:
            self._announced.add(path)
            say(f"{what} written to {path}")


class LeakGate:
    """--leak-check: each leak check a report carries, its suppressions applied, judged against
    the error kinds, and written as valgrind's XML (one file a process) and JUnit cases."""

    def __init__(
        self,
        settings: LeakCheckSettings,
        files: OutputFiles,
        xml_file: str | None = None,  # --xml-file (%p: its pid)
        junit_file: str | None = None,  # --junit: the cases so far, rewritten as they come
        tool_argv: tuple[str, ...] = (),  # leaktrace's own, for the XML's <vargv>
    ) -> None:
        self.settings, self.files = settings, files
        self.xml_file, self.junit_file, self.tool_argv = xml_file, junit_file, tool_argv
        self.leaking: list[LeakCheck] = []  # leak checks with errors left after the suppressions
        self.judged: set[int] = set()  # pids whose leak check a report carried
        self.gate_cases: list[GateCase] = []  # --junit's, one a process judged or left unjudged

    def judge(self, symbolized: SymbolizedSnapshot) -> SymbolizedSnapshot:
        """The snapshot with its leak checks' suppressions applied; each check judged and written."""
        snapshot = symbolized.snapshot
        judged = tuple(apply_suppressions(c, symbolized, self.settings.suppressions) for c in snapshot.leak_checks)
        symbolized = dataclasses.replace(symbolized, snapshot=dataclasses.replace(snapshot, leak_checks=judged))
        for check in judged:
            self.judged.add(check.pid)
            leaks = bool(check.errors(self.settings.errors_for))
            if leaks:
                self.leaking.append(check)
            judgement = Judgement(symbolized, check, self.settings, self.tool_argv)
            if self.xml_file:
                xml = RENDERERS.valgrind_xml
                self.files.write(self.xml_file.replace("%p", str(check.pid)), xml.render(judgement), xml.what)
            if self.junit_file:
                output = RENDERERS.leak_check.render(judgement).decode()
                name = f"{check.command or check.pid} (pid {check.pid})"
                self.gate_cases.append(
                    GateCase(name, check.pause_seconds, self.leak_line(check) if leaks else None, output=output)
                )
        if judged and self.junit_file:
            self.files.write(self.junit_file, RENDERERS.junit.render(self.gate_cases), RENDERERS.junit.what)
        return symbolized

    def leak_line(self, check: LeakCheck) -> str:
        """A process's leaks of the error kinds, in one line with its command line."""
        kinds = ", ".join(
            f"{kind.words}: {size:,} bytes in {blocks:,} blocks"
            for kind in sorted(self.settings.errors_for, key=list(LeakKind).index)
            for size, blocks in [check.total(kind)]
            if blocks
        )
        return f"leaks in pid {check.pid}" + (f" ({check.command})" if check.command else "") + f": {kinds}"

    def note_unjudged(self, what: str, why: str) -> None:
        """A command the gate could not judge: an error case in --junit's file."""
        if self.junit_file:
            self.gate_cases.append(GateCase(what, 0.0, error=why))
            self.files.write(self.junit_file, RENDERERS.junit.render(self.gate_cases), RENDERERS.junit.what)

    @property
    def failing_status(self) -> int:
        """--error-exitcode's N once a check found errors, else 0."""
        return (self.settings.error_exitcode or 0) if self.leaking else 0


@dataclass(frozen=True)
class AndroidFiles:
    """malloc_debug's files of each traced process: the leak-info buffer, heap dumps, the leak log."""

    leak_info: str | None = None  # raw get_malloc_leak_info buffer, rewritten each report (children: FILE.PID)
    dump_prefix: str = DEFAULT_DUMP_PREFIX  # heap dumps go to PREFIX.PID.txt and PREFIX.PID.exit.txt
    dump_each_report: bool = False  # PREFIX.PID.txt at each report (always on SIGUSR2)
    dump_on_exit: bool = False  # PREFIX.PID.exit.txt once, when a traced process exits
    backtrace_full: bool = False
    leak_track: bool = False  # the +++ leak log on stderr when a traced process exits
    per_process_leak_info: bool = False  # FILE.PID for every process, the first too (--all)

    def heap_dump(self, symbolized: SymbolizedSnapshot, pid: int, suffix: str, files: OutputFiles) -> None:
        dump = RENDERERS.heap_dump
        view = ProcessView(symbolized, pid, backtrace_full=self.backtrace_full)
        files.write(f"{self.dump_prefix}.{pid}{suffix}", dump.render(view), dump.what)

    def at_report(self, symbolized: SymbolizedSnapshot, files: OutputFiles) -> None:
        snapshot = symbolized.snapshot
        for index, (pid, process) in enumerate(snapshot.processes.items()):
            if self.leak_info:
                info = get_malloc_leak_info(snapshot, pid)
                path = self.leak_info if index == 0 and not self.per_process_leak_info else f"{self.leak_info}.{pid}"
                files.write(path, info.buffer, "leak info")
                say(
                    f"leak info of pid {pid}: overall_size {info.overall_size}, info_size {info.info_size}, "
                    f"total_memory {info.total_memory}, backtrace_size {info.backtrace_size}"
                    + (f" ({info.left_out} allocations over 2^31-1 bytes left out)" if info.left_out else "")
                )
            if self.leak_track and process.exited and snapshot.allocations is not None:
                write_fully(
                    sys.stderr, RENDERERS.leak_log.render(ProcessView(symbolized, pid, process.name or process.comm))
                )
            if self.dump_each_report:
                self.heap_dump(symbolized, pid, ".txt", files)
            if self.dump_on_exit and process.exited:
                self.heap_dump(symbolized, pid, ".exit.txt", files)


@dataclass(frozen=True)
class Reports:
    """The report on standard output and the file formats asked for (entries of RENDERERS), all
    drawn by one measure."""

    stdout: Renderer[Report] = RENDERERS.text
    files: dict[str, str] = field(default_factory=dict)  # a file format's name -> path, rewritten each report
    top: int = 10
    top_processes: int = 10
    min_bytes: int = 0  # systemwide: processes holding less are left out of the report
    contents: bool = False  # unreachable leaks with their first bytes
    measure: Measure = Measure.LIVE  # what the text table, folded stacks, HTML and pprof are drawn by

    def write(
        self,
        symbolized: SymbolizedSnapshot,
        growth: Growth,
        elapsed: float,
        leak_check: LeakCheckSettings | None,
        files: OutputFiles,
    ) -> None:
        context = RenderContext(
            growth, elapsed, self.measure, self.top, self.top_processes, self.min_bytes, self.contents, leak_check
        )
        report = Report(symbolized, context)
        write_fully(sys.stdout, self.stdout.render(report))
        for output in RENDERERS.file_formats():
            if output.name in self.files:
                files.write(self.files[output.name], output.render(report), output.what)


class Outputs:
    """Every output of a trace: each snapshot symbolized once, its growth tracked, and handed
    to the gate (when --leak-check), the reports and Android's files."""

    def __init__(
        self,
        reports: Reports,
        android: AndroidFiles,
        files: OutputFiles,
        gate: LeakGate | None = None,
        growth_intervals: int = 3,  # rises in a row that flag a stack as a likely leak
    ) -> None:
        self.reports, self.android, self.files, self.gate = reports, android, files, gate
        self.symbolizer = Symbolizer()
        self.growth = GrowthTracker(growth_intervals)
        self.started_at = time.time()

    def report(self, snapshot: Snapshot) -> None:
        """The report; per process, the leak-info file, heap dumps and, for one that exited, its leak log."""
        symbolized = self.symbolizer.symbolize(snapshot)
        if snapshot.leak_checks and self.gate is not None:
            symbolized = self.gate.judge(symbolized)
        growth = self.growth.observe(symbolized.snapshot)
        settings = self.gate.settings if self.gate else None
        self.reports.write(symbolized, growth, snapshot.taken_at - self.started_at, settings, self.files)
        self.android.at_report(symbolized, self.files)

    def dump_now(self, snapshot: Snapshot) -> None:
        symbolized = self.symbolizer.symbolize(snapshot)
        for pid in snapshot.processes:
            self.android.heap_dump(symbolized, pid, ".txt", self.files)

    def leaking_lines(self) -> list[str]:
        """At the end: each process judged with leaks of the error kinds left, with its command line."""
        return [self.gate.leak_line(check) for check in self.gate.leaking] if self.gate else []

    def exit_status(self) -> int:
        """--error-exitcode's N when the leak check found errors; else UNWRITTEN_OUTPUT once an
        output file could not be written (the trace itself ran); else 0."""
        failing = self.gate.failing_status if self.gate else 0
        return failing or (UNWRITTEN_OUTPUT if self.files.unwritten else 0)
