"""pprof's Profile message, gzip'd: what `go tool pprof`, Grafana Pyroscope, Parca and
speedscope read. Sample types as Go's heap profiles name them (alloc_objects, alloc_space:
every block made since the trace began; inuse_objects, inuse_space: live now, or at each
process's peak with --measure peak; short_lived_objects and short_lived_space added with
--measure short-lived); one sample per (pid, size, stack) with labels pid, comm, bytes (the
block size) and inherited; locations with their mappings (file, offsets, build-id) and
functions with file and line. The drop counters travel as comments.

The message types are declared below from pprof's documented format (field numbers and
types) and encoded by the protobuf library.
"""

from __future__ import annotations

import gzip
from functools import cache

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from leaktrace.analysis.symbolize import AddressSpace, Frame, SymbolizedSnapshot
from leaktrace.model.snapshot import AllocationGroup, Measure, Snapshot, StackStatus
from leaktrace.outputs.renderers import RenderContext
from leaktrace.outputs.text import drops_text, peak_text, totals_text

_T = descriptor_pb2.FieldDescriptorProto
_INT64, _UINT64, _STRING, _BOOL = _T.TYPE_INT64, _T.TYPE_UINT64, _T.TYPE_STRING, _T.TYPE_BOOL

# message -> (field, number, scalar type or message name, repeated), of package perftools.profiles.
PROFILE_SCHEMA: dict[str, list[tuple[str, int, int | str, bool]]] = {
    "Profile": [
        ("sample_type", 1, "ValueType", True),
        ("sample", 2, "Sample", True),
        ("mapping", 3, "Mapping", True),
        ("location", 4, "Location", True),
        ("function", 5, "Function", True),
        ("string_table", 6, _STRING, True),
        ("time_nanos", 9, _INT64, False),
        ("duration_nanos", 10, _INT64, False),
        ("period_type", 11, "ValueType", False),
        ("period", 12, _INT64, False),
        ("comment", 13, _INT64, True),
        ("default_sample_type", 14, _INT64, False),
    ],
    "ValueType": [("type", 1, _INT64, False), ("unit", 2, _INT64, False)],
    "Sample": [("location_id", 1, _UINT64, True), ("value", 2, _INT64, True), ("label", 3, "Label", True)],
    "Label": [
        ("key", 1, _INT64, False),
        ("str", 2, _INT64, False),
        ("num", 3, _INT64, False),
        ("num_unit", 4, _INT64, False),
    ],
    "Mapping": [
        ("id", 1, _UINT64, False),
        ("memory_start", 2, _UINT64, False),
        ("memory_limit", 3, _UINT64, False),
        ("file_offset", 4, _UINT64, False),
        ("filename", 5, _INT64, False),
        ("build_id", 6, _INT64, False),
        ("has_functions", 7, _BOOL, False),
        ("has_filenames", 8, _BOOL, False),
        ("has_line_numbers", 9, _BOOL, False),
        ("has_inline_frames", 10, _BOOL, False),
    ],
    "Location": [
        ("id", 1, _UINT64, False),
        ("mapping_id", 2, _UINT64, False),
        ("address", 3, _UINT64, False),
        ("line", 4, "Line", True),
        ("is_folded", 5, _BOOL, False),
    ],
    "Line": [("function_id", 1, _UINT64, False), ("line", 2, _INT64, False)],
    "Function": [
        ("id", 1, _UINT64, False),
        ("name", 2, _INT64, False),
        ("system_name", 3, _INT64, False),
        ("filename", 4, _INT64, False),
        ("start_line", 5, _INT64, False),
    ],
}
PACKAGE = "perftools.profiles"
GZIP_LEVEL = 1  # the agent renders a profile per scrape: level 9 took ten times as long for a tenth less


@cache
def profile_class():
    """The Profile message class, built from PROFILE_SCHEMA in a pool of its own."""
    file = descriptor_pb2.FileDescriptorProto(name="leaktrace_pprof_profile.proto", package=PACKAGE, syntax="proto3")
    for message, fields in PROFILE_SCHEMA.items():
        described = file.message_type.add(name=message)
        for name, number, kind, repeated in fields:
            field = described.field.add(
                name=name, number=number, label=_T.LABEL_REPEATED if repeated else _T.LABEL_OPTIONAL
            )
            if isinstance(kind, str):
                field.type, field.type_name = _T.TYPE_MESSAGE, f".{PACKAGE}.{kind}"
            else:
                field.type = kind
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    descriptor = pool.FindMessageTypeByName(f"{PACKAGE}.Profile")
    if hasattr(message_factory, "GetMessageClass"):  # protobuf 4.22 and later (6 and 7 have only this)
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)  # Debian 12's 3.21


class _Strings:
    """The profile's string table: index 0 is ""."""

    def __init__(self, table):
        self.table, self.index = table, {"": 0}
        table.append("")

    def __call__(self, text: str | None) -> int:
        if not text:
            return 0
        if text not in self.index:
            self.index[text] = len(self.table)
            self.table.append(text)
        return self.index[text]


class _ProfileBuilder:
    """A profile's tables as samples go in: mappings, functions and locations, each added at
    its first use and named by id after."""

    def __init__(self, symbolized: SymbolizedSnapshot):
        self.symbolized = symbolized
        self.profile = profile_class()()
        self.string = _Strings(self.profile.string_table)
        self._spaces: dict[int, AddressSpace | None] = {}  # parsed for the processes whose maps are read only
        self._mapping_ids: dict[tuple[int, int], int] = {}  # (pid, start) -> id
        self._mapping_spans: dict[int, tuple[int, int]] = {0: (0, 0)}  # id -> (start, end)
        self._module_ids: dict[tuple[str, str | None], tuple[int, int, int, int]] = {}  # -> id, start, end, bias
        self._function_ids: dict[tuple[str, str], int] = {}
        self._location_ids: dict[tuple, int] = {}

    def _mapping_at(self, pid: int, address: int, frame: Frame) -> int:
        """The id of pid's mapping holding address (0: none known), added at its first use."""
        if pid not in self._spaces:
            process = self.symbolized.snapshot.processes.get(pid)
            self._spaces[pid] = AddressSpace.of(process) if process is not None else None
        space = self._spaces[pid]
        mapping = space.find(address) if space is not None else None
        if mapping is None:
            return 0
        key = (pid, mapping.start)
        if key not in self._mapping_ids:
            self._mapping_ids[key] = len(self._mapping_ids) + 1
            self._mapping_spans[self._mapping_ids[key]] = (mapping.start, mapping.end)
            self.profile.mapping.add(
                id=self._mapping_ids[key],
                memory_start=mapping.start,
                memory_limit=mapping.end,
                file_offset=mapping.offset,
                filename=self.string(mapping.path),
                build_id=self.string(frame.build_id),
                has_functions=bool(frame.function),
                has_filenames=bool(frame.file),
                has_line_numbers=bool(frame.line),
                has_inline_frames=bool(frame.line),
            )
        return self._mapping_ids[key]

    def _placed(self, pid: int, address: int, frame: Frame) -> tuple[int, int]:
        """(mapping id, address) of a return address. One module's code is one mapping for every
        process (the first one seen where it is, by a known load bias), so that each location
        of it is one Location, whichever process it is in."""
        if frame.interpreted:  # a function of a script: its line says where, no address does
            return 0, 0
        if frame.module is None or frame.module_offset is None:
            return self._mapping_at(pid, address, frame), address
        module = (frame.module, frame.build_id)
        if module not in self._module_ids:
            found = self._mapping_at(pid, address, frame)
            self._module_ids[module] = (found, *self._mapping_spans[found], address - frame.module_offset)
        found, start, end, bias = self._module_ids[module]
        there = frame.module_offset + bias
        if found and start <= there < end:
            return found, there
        return self._mapping_at(pid, address, frame), address

    def _function_id(self, frame: Frame) -> int:
        named = (frame.function or "", frame.file or "")
        if named not in self._function_ids:
            self._function_ids[named] = len(self._function_ids) + 1
            self.profile.function.add(
                id=self._function_ids[named],
                name=self.string(frame.function),
                system_name=self.string(frame.function),
                filename=self.string(frame.file),
            )
        return self._function_ids[named]

    def _location_id(self, pid: int, address: int) -> int:
        """One location per return address (in a module: per module offset, for every process);
        its lines list the functions inlined there first."""
        frames = self.symbolized.frames_at(pid, address)
        own = frames[-1]
        key = (own.module, own.build_id, own.module_offset) if own.module_offset is not None else (pid, address)
        if key not in self._location_ids:
            self._location_ids[key] = len(self._location_ids) + 1
            mapping, there = self._placed(pid, address, own)
            location = self.profile.location.add(id=self._location_ids[key], mapping_id=mapping, address=there)
            for frame in frames:
                if frame.function:
                    location.line.add(function_id=self._function_id(frame), line=frame.line or 0)
        return self._location_ids[key]

    def add_sample(self, group: AllocationGroup, values: list[int]) -> None:
        """A sample of these values at the group's stack, with its labels."""
        string = self.string
        sample = self.profile.sample.add(value=values)
        if group.stack_status == StackStatus.CAPTURED:
            sample.location_id.extend(self._location_id(group.pid, word) for word in self.symbolized.words_of(group))
        process = self.symbolized.snapshot.processes.get(group.pid)
        sample.label.add(key=string("pid"), num=group.pid)
        sample.label.add(key=string("comm"), str=string(process.comm if process else ""))
        if process and process.container:
            sample.label.add(key=string("container_id"), str=string(process.container.id))
            if process.container.pod_uid:
                sample.label.add(key=string("pod_uid"), str=string(process.container.pod_uid))
        sample.label.add(key=string("bytes"), num=group.size, num_unit=string("bytes"))
        if group.inherited:
            sample.label.add(key=string("inherited"), str=string("true"))
        if group.samples is not None:
            sample.label.add(key=string("samples"), num=group.samples, num_unit=string("count"))
        if group.stack_status != StackStatus.CAPTURED:
            sample.label.add(key=string("stack"), str=string(group.stack_status.value))


SAMPLE_TYPES = (
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("inuse_objects", "count"),
    ("inuse_space", "bytes"),
)
SHORT_LIVED_TYPES = (("short_lived_objects", "count"), ("short_lived_space", "bytes"))
DEFAULT_TYPE = {
    Measure.LIVE: "inuse_space",
    Measure.PEAK: "inuse_space",
    Measure.ALLOCATED: "alloc_space",
    Measure.SHORT_LIVED: "short_lived_space",
}


def sample_values(snapshot: Snapshot, measure: Measure) -> dict[tuple, tuple[AllocationGroup, list[int]]]:
    """(pid, size, stack, stack status, inherited) -> a group of it (for its labels) and its
    values, in the order of the sample types."""
    width = len(SAMPLE_TYPES) + (len(SHORT_LIVED_TYPES) if measure == Measure.SHORT_LIVED else 0)
    found: dict[tuple, tuple[AllocationGroup, list[int]]] = {}

    def add(group: AllocationGroup, column: int) -> None:
        key = (group.pid, group.size, group.stack, group.stack_status, group.inherited)
        values = found.setdefault(key, (group, [0] * width))[1]
        values[column] += group.count
        values[column + 1] += group.bytes

    for group in snapshot.measured(Measure.ALLOCATED):
        add(group, 0)
    for group in snapshot.measured(Measure.PEAK if measure == Measure.PEAK else Measure.LIVE):
        add(group, 2)
    if measure == Measure.SHORT_LIVED:
        for group in snapshot.measured(Measure.SHORT_LIVED):
            add(group, 4)
    return found


def render_pprof(symbolized: SymbolizedSnapshot, duration_s: float = 0.0, measure: Measure = Measure.LIVE) -> bytes:
    """The snapshot as a gzip'd pprof profile, its default sample type that of the measure."""
    snapshot = symbolized.snapshot
    builder = _ProfileBuilder(symbolized)
    profile, string = builder.profile, builder.string
    for kind, unit in SAMPLE_TYPES + (SHORT_LIVED_TYPES if measure == Measure.SHORT_LIVED else ()):
        profile.sample_type.add(type=string(kind), unit=string(unit))
    profile.default_sample_type = string(DEFAULT_TYPE[measure])
    # Go's sampled heap profiles: the values are the estimates, the period the mean bytes between samples.
    profile.period_type.type, profile.period_type.unit = string("space"), string("bytes")
    profile.period = snapshot.sample_rate or 1
    profile.time_nanos = int(snapshot.taken_at * 1e9)
    profile.duration_nanos = int(duration_s * 1e9)
    sampled = [totals_text(snapshot)] if snapshot.sample_rate else []
    peak = [peak_text(snapshot)] if measure == Measure.PEAK else []
    for comment in (*drops_text(snapshot.counters).splitlines(), *sampled, *peak):  # the text report's lines
        profile.comment.append(string(comment))
    found = sample_values(snapshot, measure)
    for key in sorted(found, key=lambda k: (k[0], -found[k][1][3], -found[k][1][1], k[1], k[2])):
        builder.add_sample(*found[key])
    return gzip.compress(profile.SerializeToString(), compresslevel=GZIP_LEVEL, mtime=0)


def render(symbolized: SymbolizedSnapshot, context: RenderContext) -> bytes:
    return render_pprof(symbolized, context.seconds, context.measure)
