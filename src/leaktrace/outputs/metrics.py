"""The agent's Prometheus exposition: a pure function of a symbolized snapshot and its growth,
built with the Prometheus client library. Per traced process (labels pid, comm, exe, and
container_id and pod_uid, empty outside a container: labels, never credentials): live
bytes and blocks, growth rate, peak, bytes allocated since the trace began, and whether a
stack of it is a likely leak; the trace's
allocation and free totals; one drop counter series per counter; the agent's own report
latency. Processes are bounded (those holding at least min_bytes, the top_processes largest)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.process_collector import ProcessCollector

from leaktrace.analysis.growth import Growth
from leaktrace.analysis.process_table import process_rows
from leaktrace.analysis.symbolize import SymbolizedSnapshot

LABELS = ["pid", "comm", "exe", "container_id", "pod_uid"]


class _SnapshotCollector:
    def __init__(self, symbolized, growth, top_processes, min_bytes, report_seconds):
        self.symbolized, self.growth = symbolized, growth
        self.top_processes, self.min_bytes, self.report_seconds = top_processes, min_bytes, report_seconds

    def collect(self):
        snapshot = self.symbolized.snapshot
        estimate = " (estimated from samples: leaktrace_sample_rate_bytes)" if snapshot.sample_rate else ""
        live = GaugeMetricFamily(
            "leaktrace_live_bytes", f"Bytes the process holds in live allocations{estimate}", labels=LABELS
        )
        blocks = GaugeMetricFamily(
            "leaktrace_live_allocations", f"Live allocations of the process{estimate}", labels=LABELS
        )
        rate = GaugeMetricFamily(
            "leaktrace_growth_bytes_per_second", "Change of live bytes over the last interval", labels=LABELS
        )
        leaking = GaugeMetricFamily(
            "leaktrace_likely_leak",
            "1 when a stack of the process grew in each of the last intervals, beyond sampling's noise when sampled",
            labels=LABELS,
        )
        peak = GaugeMetricFamily(
            "leaktrace_peak_bytes",
            f"The most live bytes the process held since the trace began{estimate}",
            labels=LABELS,
        )
        allocated = CounterMetricFamily(
            "leaktrace_allocated_bytes",
            f"Bytes the process allocated since the trace began, freed or not{estimate}",
            labels=LABELS,
        )
        leaking_pids = {key[0] for key in self.growth.likely_leaks}
        rows = [row for row in process_rows(self.symbolized, self.growth) if row.live_bytes >= self.min_bytes]
        for row in rows[: self.top_processes]:
            info = snapshot.processes.get(row.pid)
            container = row.container
            labels = [
                str(row.pid),
                row.comm,
                info.name if info else row.comm,
                container.id if container else "",
                container.pod_uid if container else "",
            ]
            live.add_metric(labels, row.live_bytes)
            blocks.add_metric(labels, row.live_allocations)
            rate.add_metric(labels, row.growth_rate)
            leaking.add_metric(labels, 1 if row.pid in leaking_pids else 0)
            peak.add_metric(labels, row.peak_bytes)
            allocated.add_metric(labels, row.allocated_bytes)
        yield from (live, blocks, rate, leaking, peak, allocated)
        counters = snapshot.counters
        yield CounterMetricFamily(
            "leaktrace_allocations", "Allocations recorded since the trace began", counters.allocations
        )
        yield CounterMetricFamily(
            "leaktrace_frees", "Frees of recorded allocations since the trace began", counters.frees
        )
        drops = CounterMetricFamily(
            "leaktrace_drops", "Events not counted in full, by counter (see docs/counters.md)", labels=["counter"]
        )
        for name, value in counters.losses().items():
            drops.add_metric([name], value)
        yield drops
        yield GaugeMetricFamily(
            "leaktrace_sample_rate_bytes",
            "Mean bytes between samples (--sample): the live bytes and allocations are then estimates; 0: exact",
            snapshot.sample_rate,
        )
        yield GaugeMetricFamily(
            "leaktrace_report_seconds",
            "Seconds the agent's last snapshot took to read and symbolize",
            self.report_seconds,
        )


def render_metrics(
    symbolized: SymbolizedSnapshot, growth: Growth, top_processes: int, min_bytes: int, report_seconds: float
) -> bytes:
    """The text exposition (version 0.0.4) of one snapshot, with the agent's own CPU and memory."""
    registry = CollectorRegistry()
    registry.register(_SnapshotCollector(symbolized, growth, top_processes, min_bytes, report_seconds))
    ProcessCollector(registry=registry)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
    return generate_latest(registry)
