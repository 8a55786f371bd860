"""One self-contained HTML page: an interactive flame graph of live bytes by stack (click to
zoom, search, hover for bytes, blocks and sizes), the totals and drop counters, the process
table when there are several, the likely leaks, and the unreachable leaks of a check.

The flame graph is d3-flame-graph (Apache-2.0) on d3 (ISC), installed from the npm registry
by scripts/setup.sh into src/leaktrace/outputs/web/ and inlined into every page with their licences: the
page fetches nothing.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from leaktrace.analysis.growth import Growth, stack_id
from leaktrace.analysis.process_table import process_rows
from leaktrace.analysis.symbolize import SymbolizedSnapshot
from leaktrace.errors import RuntimeFailure
from leaktrace.model.snapshot import Measure, Snapshot, StackStatus, UnreachableLeak, UnreachableReport
from leaktrace.outputs.folded import stack_path
from leaktrace.outputs.renderers import RenderContext
from leaktrace.outputs.text import MEASURE_TITLES, peak_text, ranked_stacks, rate_text, sizes_text

WEB = Path(__file__).parent / "web"
ASSETS = ("d3.min.js", "d3-flamegraph.umd.min.js", "d3-flamegraph.css")
LICENCES = ("d3.LICENSE", "d3-flame-graph.LICENSE")


def _asset(name: str) -> str:
    try:
        return (WEB / name).read_text()
    except OSError:
        raise RuntimeFailure(
            f"the HTML page's flame graph library is not installed ({WEB / name}): run scripts/setup.sh"
        ) from None


def flame_tree(symbolized: SymbolizedSnapshot, measure: Measure = Measure.LIVE) -> dict:
    """The measure's bytes (live by default) as a tree, root first: all -> process ->
    [inherited] -> frames; each node's value is the bytes under it, with the blocks and the
    sizes seen there."""
    snapshot = symbolized.snapshot
    root: dict = {"name": "all", "value": 0, "count": 0, "sizes": {}, "children": {}}
    for group in snapshot.measured(measure):
        node = root
        for name in [None, *stack_path(symbolized, group)]:
            if name is not None:
                node = node["children"].setdefault(
                    name, {"name": name, "value": 0, "count": 0, "sizes": {}, "children": {}}
                )
            node["value"] += group.bytes
            node["count"] += group.count
            node["sizes"][group.size] = node["sizes"].get(group.size, 0) + group.count

    def finished(node: dict) -> dict:
        sizes = sorted(node["sizes"].items(), key=lambda item: -item[0] * item[1])
        shown = ", ".join(f"{size} x{count}" for size, count in sizes[:4]) + (", ..." if len(sizes) > 4 else "")
        return {
            "name": node["name"],
            "value": node["value"],
            "count": node["count"],
            "sizes": shown,
            "children": [finished(child) for child in node["children"].values()],
        }

    return finished(root)


def _table(header: list[str], rows: list[list[object]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


STACKS_SHOWN = 200  # rows of the top stacks' table


def _stacks_table(symbolized: SymbolizedSnapshot, measure: Measure) -> str:
    """The top stacks by the measure, with every frame (file:line included), filtered as the user types."""
    rows = []
    for groups in ranked_stacks(symbolized.snapshot.measured(measure), MEASURE_TITLES[measure][1])[:STACKS_SHOWN]:
        frames = symbolized.stack_of(groups[0])
        lines = [frame.describe() for frame in frames] or [groups[0].stack_status.value]
        cells = [groups[0].pid, sum(g.bytes for g in groups), sum(g.count for g in groups), sizes_text(groups)]
        rows.append(
            "<tr>"
            + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in cells)
            + f"<td class='frames'>{'<br>'.join(html.escape(line) for line in lines)}</td></tr>"
        )
    header = "".join(f"<th>{name}</th>" for name in ("pid", "bytes", "allocs", "sizes", "stack"))
    return (
        f"<h2>Top stacks by {html.escape(MEASURE_TITLES[measure][0])}</h2>"
        "<input id='filter' placeholder='filter stacks (function, file, module)'>"
        f"<table id='stacks-table'><thead><tr>{header}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _script_json(value: object) -> str:
    """JSON that cannot end the <script> element it sits in."""
    return json.dumps(value, separators=(",", ":")).replace("<", "\\u003c")


def _head(snapshot: Snapshot, title: str) -> str:
    counters = snapshot.counters
    head = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p id='totals'>{snapshot.live_bytes} live bytes in {snapshot.live_allocations} allocations "
        f"({counters.allocations} allocated, {counters.frees} freed since the trace began)</p>",
    ]
    warning = counters.incompleteness()
    if warning:
        head.append(f"<p class='warning'>{html.escape(warning)}</p>")
    return "".join(head)


def _processes_section(symbolized: SymbolizedSnapshot, growth: Growth) -> str:
    rows = [
        [
            r.pid,
            r.comm,
            r.live_bytes,
            r.live_allocations,
            rate_text(r.growth_rate),
            r.top_site,
            "exited" if r.exited else "",
        ]
        for r in process_rows(symbolized, growth)
    ]
    header = ["pid", "comm", "live bytes", "live blocks", "growth", "largest stack's caller", ""]
    return "<h2>Processes</h2>" + _table(header, rows)


def _likely_leaks_section(symbolized: SymbolizedSnapshot, growth: Growth) -> str:
    rows: list[list[object]] = []
    for groups in ranked_stacks(symbolized.snapshot.groups):
        rate = growth.likely_leaks.get(stack_id(groups[0]))
        if rate is not None:
            frames = symbolized.stack_of(groups[0])
            where = frames[0].describe() if frames else groups[0].stack_status.value
            rows.append([groups[0].pid, rate_text(rate), sum(g.bytes for g in groups), where])
    return "<h2>Likely leaks (growing)</h2>" + _table(["pid", "growth", "live bytes", "allocated at"], rows)


def _unreachable_section(symbolized: SymbolizedSnapshot, report: UnreachableReport) -> str:
    def allocated_at(leak: UnreachableLeak) -> str:
        if leak.stack:
            return symbolized.frames_at(leak.pid, leak.stack[0])[0].describe()
        return "before the trace" if leak.stack_status == StackStatus.BEFORE_TRACE else "no stack"

    rows: list[list[object]] = [
        [
            leak.size,
            leak.similar_count + 1,
            f"{leak.address:#x}",
            f"{leak.referenced_size} bytes in {leak.referenced_count}",
            allocated_at(leak),
        ]
        for leak in report.leaks
    ]
    return (
        f"<h2>Unreachable memory of pid {report.pid}</h2><p>{report.leak_bytes} bytes in "
        f"{report.num_leaks} unreachable allocations</p>"
        + _table(["size", "blocks", "first at", "referencing (only through it)", "allocated at"], rows)
    )


def render_html(
    symbolized: SymbolizedSnapshot, growth: Growth = Growth(), title: str | None = None, measure: Measure = Measure.LIVE
) -> str:
    snapshot = symbolized.snapshot
    if title is None:
        named = [f"{p.comm} ({p.pid})" for p in snapshot.processes.values()]
        title = "leaktrace: " + (named[0] if len(named) == 1 else f"{len(named)} processes")
    head = _head(snapshot, title)
    parts = [_stacks_table(symbolized, measure)]
    if snapshot.peaks:
        parts.append(f"<h2>Peak</h2><p>{html.escape(peak_text(snapshot))}</p>".replace("\n", "<br>"))
    parts.append(
        "<h2>Drop counters</h2>" + _table(["counter", "value"], [[n, v] for n, v in snapshot.counters.losses().items()])
    )
    if len(snapshot.processes) > 1:
        parts.append(_processes_section(symbolized, growth))
    if growth.likely_leaks:
        parts.append(_likely_leaks_section(symbolized, growth))
    if snapshot.unreachable:
        parts.append(_unreachable_section(symbolized, snapshot.unreachable))
    licences = "\n".join(_asset(name) for name in LICENCES)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<!-- d3 and d3-flame-graph, inlined under their licences:
{html.escape(licences).replace("--", "- -")}
-->
<style>{_asset("d3-flamegraph.css")}
body {{ font-family: sans-serif; margin: 1em 2em; }} table {{ border-collapse: collapse; margin-bottom: 1em; }}
td, th {{ border: 1px solid #ccc; padding: 2px 8px; text-align: left; }} .warning {{ color: #b00; font-weight: bold; }}
#details {{ min-height: 1.5em; font-family: monospace; }}
td.frames {{ font-family: monospace; font-size: 90%; }}</style>
</head><body>
{head}
<h2>{html.escape(MEASURE_TITLES[measure][0]).capitalize()} by stack</h2>
<form id="search" onsubmit="return false"><input id="term" placeholder="search functions">
<button id="find">Search</button> <button id="reset">Reset zoom</button></form>
<div id="chart"></div><div id="details"></div>
{"".join(parts)}
<pre id="errors"></pre>
<script type="application/json" id="stacks">{_script_json(flame_tree(symbolized, measure))}</script>
<script>window.onerror = function (message) {{
  document.getElementById("errors").textContent += message + "\\n"; }};</script>
<script>{_asset("d3.min.js")}</script>
<script>{_asset("d3-flamegraph.umd.min.js")}</script>
<script>
(function () {{
  var data = JSON.parse(document.getElementById("stacks").textContent);
  var make = flamegraph.flamegraph || flamegraph.default;
  var chart = make().width(Math.max(600, document.body.clientWidth - 40)).cellHeight(18).minFrameSize(1)
    .setLabelHandler(function (d) {{
      return d.data.name + ": " + d.value + " bytes in " + d.data.count + " blocks (sizes " + d.data.sizes + ")";
    }})
    .setDetailsElement(document.getElementById("details"));
  d3.select("#chart").datum(data).call(chart);
  chart.transitionDuration(300);   // drawn at once; zooms are animated
  document.getElementById("find").onclick = function () {{ chart.search(document.getElementById("term").value); }};
  document.getElementById("reset").onclick = function () {{ chart.resetZoom(); }};
  document.getElementById("filter").oninput = function () {{
    var term = this.value.toLowerCase();
    document.querySelectorAll("#stacks-table tbody tr").forEach(function (row) {{
      row.style.display = row.textContent.toLowerCase().indexOf(term) < 0 ? "none" : "";
    }});
  }};
  document.body.setAttribute("data-rendered", "yes");
}})();
</script>
</body></html>
"""


def render(symbolized: SymbolizedSnapshot, context: RenderContext) -> bytes:
    return render_html(symbolized, context.growth, measure=context.measure).encode()
