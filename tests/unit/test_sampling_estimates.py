"""The estimator behind --sample: each kept block of size s stands for 1/p(s) blocks and
s/p(s) bytes, p(s) = 1 - exp(-s/R). Unbiased below, near and far above the rate (Go scaled
large blocks as small ones for years: its issue 26618), checked on seeded simulations of
the sampler itself; sizes parsed as users write them."""

from __future__ import annotations

import math
import random

import pytest

from leaktrace.model.snapshot import AllocationGroup, Counters, Snapshot, keep_probability
from leaktrace.sources.sampling import EXACT, Sampling, estimated, parse_size


def simulated(blocks: int, size: int, rate: int, chosen: random.Random) -> int:
    """The sampler as the library runs it, on blocks of one size: a countdown of bytes to the
    next point, drawn from an exponential distribution; the block that reaches it is kept and
    a new countdown starts after it. The blocks kept (a step per kept block, not per block)."""
    kept, end = 0, blocks * size
    point = chosen.expovariate(1 / rate)
    while point <= end:
        block = max(math.ceil(point / size) - 1, 0)
        kept += 1
        point = (block + 1) * size + chosen.expovariate(1 / rate)
    return kept


@pytest.mark.parametrize("size", [16, 4096, 65536, 524288, 4 << 20, 64 << 20])
def test_the_estimate_is_unbiased_for_sizes_below_near_and_far_above_the_rate(size):
    seed = random.randrange(1 << 32)
    print(f"seed {seed}")
    chosen, rate = random.Random(seed), 512 << 10
    total = 1 << 33  # 8 GiB of blocks of this size, in 40 runs
    blocks = total // size // 40
    estimates = []
    for _ in range(40):
        kept = simulated(blocks, size, rate, chosen)
        group = AllocationGroup(1, size, kept)
        [estimate] = estimated(Snapshot(0.0, (group,), Counters()), Sampling(rate, 1)).groups
        estimates.append(estimate.bytes)
    truth = blocks * size
    chance = keep_probability(size, rate)
    deviation = size * math.sqrt(blocks * (1 - chance) / chance) / math.sqrt(len(estimates))
    mean = sum(estimates) / len(estimates)
    assert abs(mean - truth) <= 4 * deviation + size, (size, mean, truth, deviation, seed)


def test_groups_keep_their_samples_and_exact_snapshots_are_left_alone():
    groups = (AllocationGroup(1, 64, 3), AllocationGroup(1, 1 << 30, 2))
    snapshot = Snapshot(0.0, groups, Counters())
    assert estimated(snapshot, EXACT) is snapshot
    small, large = estimated(snapshot, Sampling(512 << 10, 9)).groups
    assert small.samples == 3 and small.count == round(3 / keep_probability(64, 512 << 10))
    assert large.samples == 2 and large.count == 2  # a GiB block is always kept: it stands for itself


@pytest.mark.parametrize(
    "text, size",
    [("524288", 524288), ("512KiB", 512 << 10), ("512k", 512 << 10), ("2MiB", 2 << 20), ("1G", 1 << 30), ("0", 0)],
)
def test_sizes_as_users_write_them(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "KiB", "1.5MiB", "-1", "1 TiB", "9" * 30, "1e6"])
def test_other_sizes_are_refused(text):
    with pytest.raises(ValueError):
        parse_size(text)
