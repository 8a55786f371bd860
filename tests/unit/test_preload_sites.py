"""The library's sites as leaktrace reads them back (record.h's layout): a file the target
wrote at its exit is hostile input, refused in one DamagedTable line where it could not be
the library's."""

from __future__ import annotations

import struct
from importlib.machinery import EXTENSION_SUFFIXES

import pytest

from leaktrace.abi.layout import PEAK
from leaktrace.abi.record import MAX_FRAMES, SITE, SITE_COUNTS, SITE_SLOTS
from leaktrace.errors import RuntimeFailure
from leaktrace.platform.arch import built_here
from leaktrace.sources.preload import table
from leaktrace.sources.preload.table import DamagedTable, parse_sites, peak_of, preload_library, site_totals

PID = 42


def site(size: int, frames: list[int], slots: list[tuple[int, int, int, int, int, int]]) -> bytes:
    """A site as write_sites writes it: header, SITE_SLOTS slots (live, allocations, frees,
    short-lived, peak_live, peak_epoch), frames (pcs inside the call: return address - 1)."""
    head = SITE.pack(len(frames), 0, 0x1234, size, 0x7000, b"\0" * 32)
    counts = [SITE_COUNTS.pack(0, 0, *slot, b"\0" * 8) for slot in slots]
    counts += [SITE_COUNTS.pack(0, 0, 0, 0, 0, 0, 0, 0, b"\0" * 8)] * (SITE_SLOTS - len(slots))
    return head + b"".join(counts) + struct.pack(f"<{len(frames)}Q", *frames)


def peak(live: int, peak_bytes: int, epoch: int, epoch_bytes: int, unpublished: int = 0) -> bytes:
    return PEAK.pack(live, peak_bytes, 5_000_000_000, epoch, epoch_bytes, 5_000_000_000, unpublished)


def test_totals_sum_the_slots_and_the_peak_takes_each_slot_as_of_its_epoch():
    data = peak(640, 4096 + 640, 7, 4096 + 640) + site(
        64, [0x1000, 0x2000], [(10, 100, 90, 80, 0, 0), (0, 50, 50, 50, 0, 0)]
    )
    data += site(4096, [0x3000], [(0, 1, 1, 0, 1, 7)])  # changed since epoch 7: 1 block then
    sites, found = parse_sites(data, PID)
    totals = {t.size: (t.allocations, t.frees, t.short_lived) for t in site_totals(PID, sites)}
    assert totals == {64: (150, 140, 130), 4096: (1, 1, 0)}
    (top,) = peak_of(PID, sites, found)
    assert (top.bytes, top.bound) == (4096 + 640, 0)
    assert sorted((g.size, g.count) for g in top.groups) == [(64, 10), (4096, 1)]


def test_a_peak_with_threads_unpublished_says_its_bound():
    (top,) = peak_of(PID, [], struct.unpack(PEAK.format, peak(0, 1 << 20, 3, (1 << 20) - 100, 3 << 16)))
    assert top.bound == 100 + (3 << 16)


@pytest.mark.parametrize(
    "data",
    [
        b"\0" * (PEAK.size - 1),  # no room for the peak
        peak(0, 0, 0, 0) + site(8, [0x10], [])[:-1],  # a site's frames cut short
        peak(0, 0, 0, 0) + site(8, [], [])[: SITE.size + 3],  # its slots cut short
        peak(0, 0, 0, 0) + SITE.pack(MAX_FRAMES + 1, 0, 0, 8, 0, b"\0" * 32) + b"\0" * (SITE_SLOTS * SITE_COUNTS.size),
    ],
)
def test_a_file_the_library_could_not_have_written_is_refused(data):
    with pytest.raises(DamagedTable):
        parse_sites(data, PID)


def test_each_libcs_build_of_the_library_is_found_or_its_absence_said(monkeypatch):
    """pip install builds both (the musl one with musl-gcc); one not built is named in one line."""
    assert preload_library().endswith(".so") and preload_library(on_musl=True).endswith("/malloc_debug_musl.so")
    monkeypatch.setattr(table.os.path, "isfile", lambda path: False)
    monkeypatch.setattr(table, "built_here", lambda directory, stem: None)
    with pytest.raises(RuntimeFailure) as refused:
        preload_library(on_musl=True)
    assert str(refused.value) == (
        "leaktrace's preload library for musl (musl-gcc was not found when it was built) is not built: "
        "reinstall leaktrace (pip install)"
    )
    with pytest.raises(RuntimeFailure) as refused:
        preload_library()
    assert str(refused.value) == "leaktrace's preload library is not built: reinstall leaktrace (pip install)"


def test_an_extension_module_of_another_machine_is_never_taken(tmp_path):
    """Another machine's build beside this machine's in one checkout (an arm64 VM's: vm.sh --arch arm64)."""
    (tmp_path / "_malloc_debug.cpython-311-riscv64-linux-gnu.so").write_bytes(b"")
    assert built_here(tmp_path, "_malloc_debug") is None
    ours = tmp_path / f"_malloc_debug{EXTENSION_SUFFIXES[0]}"
    ours.write_bytes(b"")
    assert built_here(tmp_path, "_malloc_debug") == str(ours)
