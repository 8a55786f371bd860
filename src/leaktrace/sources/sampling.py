"""Sampled traces (--sample BYTES): which blocks a source keeps, and what they stand for.

A source that samples keeps a block of size s with probability p(s) = 1 - exp(-s / R), R the
mean bytes between samples (Poisson sampling over bytes, as tcmalloc, jemalloc and Go sample).
Each kept block then stands for 1 / p(s) blocks, and for s / p(s) bytes: the unbiased
estimates, whatever the size, since p is the exact chance of a block of that size (Go's
heap profiles over-counted large blocks for years, its issue 26618, by scaling them as small
ones). The variance of a site's byte estimate is about B * R for B true bytes held in blocks
much smaller than R, and falls to nothing for blocks much larger than R (each is kept).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from leaktrace.model.snapshot import AllocationGroup, Snapshot, keep_probability

SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}
SEED_BITS = 63


@dataclass(frozen=True)
class Sampling:
    """Sampling by bytes: a sample every rate bytes on average (0: every block), from a
    generator seeded with seed (each thread's: seed, then its ordinal)."""

    rate: int = 0
    seed: int = 0


EXACT = Sampling()  # every block kept


def estimated(snapshot: Snapshot, sampling: Sampling) -> Snapshot:
    """The snapshot's groups as estimates of the whole heap: each group's count is the blocks
    its samples stand for (so its bytes, size x count, are the byte estimate), its samples
    kept beside them; so are the sites' totals, and each peak is the estimate of its groups."""
    if not sampling.rate:
        return snapshot

    def scaled(kept: int, size: int) -> int:
        chance = keep_probability(size, sampling.rate)
        return round(kept / chance) if chance else 0

    def groups_of(groups: tuple[AllocationGroup, ...]) -> tuple[AllocationGroup, ...]:
        return tuple(
            dataclasses.replace(group, count=scaled(group.count, group.size), samples=group.count) for group in groups
        )

    sites = tuple(
        dataclasses.replace(
            site,
            allocations=scaled(site.allocations, site.size),
            frees=scaled(site.frees, site.size),
            short_lived=None,  # a thread's next call is mostly unseen
            samples=site.allocations,
        )
        for site in snapshot.sites
    )
    peaks = []
    for peak in snapshot.peaks:
        groups = groups_of(peak.groups)
        peaks.append(dataclasses.replace(peak, groups=groups, bytes=sum(g.bytes for g in groups), estimate=True))
    return dataclasses.replace(
        snapshot,
        groups=groups_of(snapshot.groups),
        sites=sites,
        peaks=tuple(peaks),
        sample_rate=sampling.rate,
        sample_seed=sampling.seed,
    )


def random_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") >> (64 - SEED_BITS)


def parse_size(text: str) -> int:
    """BYTES as users write it: 524288, 512KiB, 512k, 2MiB, 1G (binary units). ValueError if not."""
    stripped = text.strip().lower()
    digits = len(stripped) - len(stripped.lstrip("0123456789"))
    number, unit = stripped[:digits], stripped[digits:].strip()
    if not number or unit not in SIZE_UNITS or len(number) > 19:
        raise ValueError(text)
    return int(number) * SIZE_UNITS[unit]
