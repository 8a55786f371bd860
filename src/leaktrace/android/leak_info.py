"""get_malloc_leak_info's buffer: encode a snapshot, decode a buffer.

Entry layout (README_api.md): size_t size (bit 31, Android's zygote bit: made by a process
forked from a traced one, after the fork), size_t num_allocations, then backtrace_size pcs, zero-padded; words are
8 bytes for the 64-bit ABI and 4 for the 32-bit one, little-endian.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from leaktrace.android.records import LeakRecord, merged_records, sorted_records
from leaktrace.model.snapshot import Snapshot

ZYGOTE_BIT = 1 << 31
MAX_ENCODABLE_SIZE = ZYGOTE_BIT - 1  # malloc_debug's PointerInfoType::MaxSize()


@dataclass(frozen=True)
class LeakInfo:
    buffer: bytes
    overall_size: int
    info_size: int
    total_memory: int
    backtrace_size: int
    left_out: int = 0  # allocations larger than 2^31-1: bit 31 would be ambiguous

    def as_tuple(self) -> tuple[bytes, int, int, int, int]:
        return self.buffer, self.overall_size, self.info_size, self.total_memory, self.backtrace_size


def _word(abi: int) -> str:
    if abi not in (32, 64):
        raise ValueError(f"ABI must be 32 or 64, not {abi}")
    return "<I" if abi == 32 else "<Q"


def encode_leak_info(records: list[LeakRecord], backtrace_size: int, abi: int = 64) -> LeakInfo:
    """The buffer for records already sorted; adjacent equal records are merged here."""
    word = _word(abi)
    left_out = sum(r.num_allocations for r in records if r.size > MAX_ENCODABLE_SIZE)
    entries = merged_records([r for r in records if r.size <= MAX_ENCODABLE_SIZE])
    if not entries:
        return LeakInfo(b"", 0, 0, 0, 0, left_out)
    width = struct.calcsize(word)
    info_size = width * (2 + backtrace_size)
    parts = []
    for entry in entries:
        frames = entry.frames[:backtrace_size]
        words = [entry.size | (ZYGOTE_BIT if entry.zygote else 0), entry.num_allocations, *frames]
        words += [0] * (2 + backtrace_size - len(words))
        parts.append(b"".join(struct.pack(word, w & (2 ** (8 * width) - 1)) for w in words))
    total = sum(e.size * e.num_allocations for e in entries)
    return LeakInfo(b"".join(parts), info_size * len(entries), info_size, total, backtrace_size, left_out)


def get_malloc_leak_info(snapshot: Snapshot, pid: int, backtrace_size: int | None = None, abi: int = 64) -> LeakInfo:
    """What get_malloc_leak_info() would return in process pid at snapshot time."""
    return encode_leak_info(
        sorted_records(snapshot, pid), snapshot.backtrace_frames if backtrace_size is None else backtrace_size, abi
    )


@dataclass(frozen=True)
class LeakInfoEntry:
    zygote: bool
    size: int
    num_allocations: int
    frames: tuple[int, ...]  # up to the first zero pc
    impossible: str | None = None  # why no get_malloc_leak_info could have written this entry


def _impossible(size_word: int, num_allocations: int, pcs: list[int]) -> str | None:
    if size_word >> 32:
        return "size above 2^31"  # bit 31 is the zygote bit; larger blocks are left out
    if num_allocations == 0:
        return "no allocations"
    frames = pcs.index(0) if 0 in pcs else len(pcs)
    if any(pcs[frames:]):
        return "pcs after the zero padding"
    return None


def iter_leak_info(buffer: bytes, backtrace_size: int, abi: int = 64) -> Iterator[LeakInfoEntry]:
    """The entries of a buffer, one at a time (a file's buffer may be large)."""
    word = _word(abi)
    width = struct.calcsize(word)
    info_size = width * (2 + backtrace_size)
    if len(buffer) % info_size:
        raise ValueError(f"buffer of {len(buffer)} bytes is not a whole number of {info_size}-byte entries")
    for words in struct.iter_unpack(f"<{2 + backtrace_size}{word[1]}", buffer):
        size_word, num, pcs = words[0], words[1], list(words[2:])
        frames = pcs[: pcs.index(0)] if 0 in pcs else pcs
        yield LeakInfoEntry(
            bool(size_word & ZYGOTE_BIT), size_word & ~ZYGOTE_BIT, num, tuple(frames), _impossible(size_word, num, pcs)
        )


def decode_leak_info(buffer: bytes, backtrace_size: int, abi: int = 64) -> list[LeakInfoEntry]:
    return list(iter_leak_info(buffer, backtrace_size, abi))
