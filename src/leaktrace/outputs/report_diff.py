"""Two of leaktrace's reports compared site by site (`leaktrace diff OLD NEW`): the last JSON
report of a file of report lines, or a pprof profile (--pprof). A site is a stack named by
its frames' functions, files and lines, never by addresses, so runs of one program compare
across address-space layouts; its processes and block sizes are merged."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from leaktrace.outputs.pprof import profile_class
from leaktrace.platform.process import printable

# A frame as two runs can share it: (function, file, line); "?" for a function not named.
SiteFrame = tuple[str, str, int]
Site = tuple[SiteFrame, ...]
REPORT_READ_LIMIT = 256 << 20  # bytes of a report file
PROFILE_LIMIT = 64 << 20  # bytes a profile's gzip may unpack to (leaktrace's are a few MiB)
GZIP_MAGIC = b"\x1f\x8b"
UNNAMED = "?"


@dataclass(frozen=True)
class Held:
    """What a report holds at a site: live bytes and blocks."""

    bytes: int = 0
    count: int = 0


@dataclass(frozen=True)
class SiteChange:
    site: Site
    before: Held
    after: Held

    @property
    def bytes(self) -> int:
        return self.after.bytes - self.before.bytes

    @property
    def count(self) -> int:
        return self.after.count - self.before.count

    @property
    def status(self) -> str:
        """ "new" (not in OLD), "gone" (not in NEW), else "changed" or "same"."""
        if self.before == Held():
            return "new"
        if self.after == Held():
            return "gone"
        return "same" if self.before == self.after else "changed"


class UnreadableReport(ValueError):
    """A file that is neither a JSON report of leaktrace's nor a pprof profile."""


def _merged(pairs: Iterable[tuple[Site, int, int]]) -> dict[Site, Held]:
    sites: dict[Site, Held] = {}
    for site, size, count in pairs:
        held = sites.get(site, Held())
        sites[site] = Held(held.bytes + size, held.count + count)
    return sites


def _no_constant(name: str) -> None:
    raise UnreadableReport(f"a report line holds {name[:9]}, which leaktrace never writes")


def _count(value: object, where: str) -> int:
    """A whole number of leaktrace's (never a bool, a float or text); the value is never echoed."""
    if type(value) is not int or not 0 <= value < 1 << 64:
        raise UnreadableReport(f"{where} is not a count leaktrace would write")
    return value


def _name(value: object, where: str) -> str:
    """A function or file name of a report, its control characters escaped (it may be anyone's)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise UnreadableReport(f"{where} is not a name")
    return printable(value)


def _frame(frame: object, where: str) -> SiteFrame:
    if not isinstance(frame, dict):
        raise UnreadableReport(f"{where} is not a frame")
    line = frame.get("line")
    return (
        _name(frame.get("function"), f"{where}'s function") or UNNAMED,
        _name(frame.get("file"), f"{where}'s file"),
        0 if line is None else _count(line, f"{where}'s line"),
    )


def sites_of_json(text: str) -> dict[Site, Held]:
    """The last report among a file's lines (a trace's --json output)."""
    last = None
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("{"):
            try:
                report = json.loads(line, parse_constant=_no_constant)
            except json.JSONDecodeError as e:
                raise UnreadableReport(f"line {number} is not JSON ({e.msg})") from None
            except RecursionError:
                raise UnreadableReport(f"line {number} nests deeper than any report of leaktrace's") from None
            if isinstance(report, dict) and isinstance(report.get("groups"), list):
                last = report
    if last is None:
        raise UnreadableReport("no leaktrace JSON report in it")
    found = []
    for i, group in enumerate(last["groups"]):
        where = f"group {i}"
        if not isinstance(group, dict) or not isinstance(group.get("frames"), list):
            raise UnreadableReport(f"{where} is not as leaktrace writes it")
        site = tuple(_frame(frame, f"{where} frame {j}") for j, frame in enumerate(group["frames"]))
        found.append(
            (site, _count(group.get("bytes"), f"{where}'s bytes"), _count(group.get("count"), f"{where}'s count"))
        )
    return _merged(found)


def sites_of_pprof(data: bytes) -> dict[Site, Held]:
    """A profile's inuse_space and inuse_objects per stack, each location's lines innermost first."""
    profile = profile_class()()
    try:
        profile.ParseFromString(_gunzipped(data))
    except UnreadableReport:
        raise
    except Exception:  # noqa: BLE001 - protobuf's and zlib's errors have no common base
        raise UnreadableReport("not a gzip'd pprof profile") from None
    strings = list(profile.string_table)

    def text(index: int) -> str:
        return strings[index] if 0 <= index < len(strings) else ""

    kinds = [text(kind.type) for kind in profile.sample_type]
    if "inuse_space" not in kinds or "inuse_objects" not in kinds:
        raise UnreadableReport(f"no inuse_space and inuse_objects among its sample types ({', '.join(kinds)})")
    space, objects = kinds.index("inuse_space"), kinds.index("inuse_objects")
    functions = {
        function.id: (printable(text(function.name)), printable(text(function.filename)))
        for function in profile.function
    }
    locations: dict[int, list[SiteFrame]] = {}
    for location in profile.location:
        lines = [(*functions.get(line.function_id, (UNNAMED, "")), line.line) for line in location.line]
        locations[location.id] = [(name or UNNAMED, file, line) for name, file, line in lines] or [(UNNAMED, "", 0)]
    return _merged(
        (
            tuple(frame for location in sample.location_id for frame in locations.get(location, [])),
            sample.value[space],
            sample.value[objects],
        )
        for sample in profile.sample
    )


def _gunzipped(data: bytes) -> bytes:
    """gzip's content, unpacked a MiB at a time to at most PROFILE_LIMIT bytes (a small file may
    unpack to gigabytes)."""
    unpacker, pieces, size = zlib.decompressobj(16 + zlib.MAX_WBITS), [], 0
    rest = data
    while rest and not unpacker.eof:
        piece = unpacker.decompress(rest, 1 << 20)
        rest = unpacker.unconsumed_tail
        size += len(piece)
        if size > PROFILE_LIMIT:
            raise UnreadableReport(f"the profile unpacks to more than {PROFILE_LIMIT >> 20} MiB")
        pieces.append(piece)
    return b"".join(pieces)


def read_sites(data: bytes) -> dict[Site, Held]:
    """A report file's sites, by what the file is."""
    if data.startswith(GZIP_MAGIC):
        return sites_of_pprof(data)
    try:
        return sites_of_json(data.decode())
    except UnicodeDecodeError:
        raise UnreadableReport("neither JSON text nor a gzip'd profile") from None


def compare(before: dict[Site, Held], after: dict[Site, Held]) -> list[SiteChange]:
    """Every site of either report, the largest change in bytes first (growth before a fall of
    the same size), then the largest change in blocks."""
    changes = [SiteChange(site, before.get(site, Held()), after.get(site, Held())) for site in before.keys() | after]
    return sorted(changes, key=lambda c: (-abs(c.bytes), -c.bytes, -abs(c.count), c.site))


def site_name(site: Site, depth: int = 3) -> str:
    """The innermost frames of a site, callers after '<'."""
    if not site:
        return "(no stack)"
    named = [
        f"{name} ({file}:{line})" if file and line else f"{name} ({file})" if file else name
        for name, file, line in site
    ]
    return " < ".join(named[:depth]) + (" < ..." if len(site) > depth else "")


def render_diff_text(changes: list[SiteChange], old: str, new: str, top: int) -> str:
    """A table of the sites whose figures changed (at most top), the totals first."""
    before = Held(sum(c.before.bytes for c in changes), sum(c.before.count for c in changes))
    after = Held(sum(c.after.bytes for c in changes), sum(c.after.count for c in changes))
    lines = [
        f"live: {before.bytes:,} B in {before.count:,} blocks ({old}) -> {after.bytes:,} B in {after.count:,} "
        f"blocks ({new}): {after.bytes - before.bytes:+,} B, {after.count - before.count:+,} blocks",
    ]
    moved = [change for change in changes if change.status != "same"]
    header = ("change B", "before B", "after B", "change n", "before n", "after n")
    rows = [
        (
            f"{c.bytes:+,}",
            f"{c.before.bytes:,}",
            f"{c.after.bytes:,}",
            f"{c.count:+,}",
            f"{c.before.count:,}",
            f"{c.after.count:,}",
            site_name(c.site) + (f"  [{c.status}]" if c.status in ("new", "gone") else ""),
        )
        for c in moved[:top]
    ]
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(header)]
    lines.append("  ".join(h.rjust(w) for h, w in zip(header, widths)) + "  site")
    lines.extend("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in rows)
    if len(moved) > top:
        lines.append(f"... {len(moved) - top} more sites changed (--top N shows more)")
    unchanged = len(changes) - len(moved)
    lines.append(f"{len(moved)} sites changed, {unchanged} unchanged")
    return "\n".join(lines) + "\n"


def diff_to_dict(changes: list[SiteChange], old: str, new: str) -> dict:
    """The machine form: every site, unchanged ones too, in the text's order."""

    def held(h: Held) -> dict:
        return {"bytes": h.bytes, "count": h.count}

    return {
        "old": old,
        "new": new,
        "sites": [
            {
                "frames": [
                    {"function": name, "file": file or None, "line": line or None} for name, file, line in c.site
                ],
                "status": c.status,
                "before": held(c.before),
                "after": held(c.after),
                "change": {"bytes": c.bytes, "count": c.count},
            }
            for c in changes
        ],
    }
