"""The glibc heap walk (reachability/glibc_heap.py) on a frozen copy of a program whose heap
has a known shape (tests/unit/native/heap_shapes.c: two arenas, blocks freed into every kind
of bin, mmapped blocks), and on damaged copies of that image. A process's memory is the
target's to write: every damaged copy gives a walk that names its problems, or
HeapWalkRefused, never another exception, and no block outside the copy's memory. The
process is the test's own child: no root is needed."""

from __future__ import annotations

import dataclasses
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest

from leaktrace.model.snapshot import request_range
from leaktrace.platform.freeze import FrozenImage, freeze_and_copy
from leaktrace.platform.process import read_process
from leaktrace.reachability.glibc_heap import HeapWalkRefused, walk_heap
from leaktrace.reachability.unreachable import scanned_mapping

NATIVE = Path(__file__).parent / "native"
DAMAGED_COPIES = 150


@dataclasses.dataclass
class Recorded:
    process: object
    image: FrozenImage
    kept: dict[int, int]  # address -> bytes asked for
    freed: set[int]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    binary = tmp_path_factory.mktemp("heap") / "heap_shapes"
    flags = ["-O2", "-Wall", "-Wextra", "-Werror", "-pthread"]
    subprocess.run(["gcc", *flags, "-o", binary, NATIVE / "heap_shapes.c"], check=True)
    target = subprocess.Popen([binary], stdout=subprocess.PIPE, text=True)
    try:
        kept, freed = {}, set()
        for line in target.stdout:
            words = line.split()
            if words == ["ready"]:
                break
            if words[0] == "kept":
                kept[int(words[1], 16)] = int(words[2])
            else:
                freed.add(int(words[1], 16))
        yield Recorded(read_process(target.pid), freeze_and_copy(target.pid, scanned_mapping), kept, freed)
    finally:
        target.kill()
        target.wait()


def test_walk_finds_the_kept_blocks_and_not_the_freed(recorded):
    walk = walk_heap(recorded.process, recorded.image)
    assert walk.complete, walk.problems
    assert len(walk.arenas) == 2
    usable = dict(zip(walk.addresses.tolist(), walk.usable.tolist()))
    for address, size in recorded.kept.items():
        low, high = request_range(usable[address])
        assert low <= size <= high, (hex(address), size, usable[address])
    assert not recorded.freed & set(usable)
    mmapped = set(walk.addresses[walk.mmapped].tolist())
    assert {a for a, size in recorded.kept.items() if size >= 200000} == mmapped
    # Without libc's symbols: main_arena and the tcaches found by their shapes, the same blocks.
    again = walk_heap(recorded.process, recorded.image, use_debug_file=False)
    assert again.addresses.tolist() == walk.addresses.tolist()


def _damaged(image: FrozenImage, rng: random.Random, targets: list[int]) -> FrozenImage:
    """A copy of image with a few words overwritten: chunk headers and the words around them,
    or any word of the copy, with garbage, zero, or an address near a real one."""
    memory = {start: bytearray(data) for start, data in image.memory.items()}
    starts = sorted(memory)
    for _ in range(rng.randint(1, 6)):
        if rng.random() < 0.7:
            address = rng.choice(targets) + 8 * rng.randint(-3, 2)
        else:
            start = rng.choice(starts)
            address = start + 8 * rng.randrange(len(memory[start]) // 8)
        region = next((s for s in reversed(starts) if s <= address < s + len(memory[s]) - 8), None)
        if region is None:
            continue
        value = rng.choice([0, rng.getrandbits(64), rng.choice(targets) + 16 * rng.randint(-4, 4), 1 << 63])
        offset = address - region
        memory[region][offset : offset + 8] = value.to_bytes(8, "little")
    return dataclasses.replace(image, memory=memory)


def test_damaged_images_give_a_walk_with_its_problems_or_a_refusal(recorded):
    seed = random.randrange(1 << 32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    walk = walk_heap(recorded.process, recorded.image)
    # The chunk headers (8 bytes before each block) and the arenas' words are what the walk follows.
    targets = [a - 8 for a in walk.addresses.tolist()] + [start for start, _ in walk.allocator_state]
    ranges = [(start, start + len(data)) for start, data in recorded.image.memory.items()]
    outcomes = {"walked": 0, "with problems": 0, "refused": 0}
    for _ in range(DAMAGED_COPIES):
        image = _damaged(recorded.image, rng, targets)
        try:
            damaged = walk_heap(recorded.process, image)
        except HeapWalkRefused:
            outcomes["refused"] += 1
            continue
        outcomes["with problems" if damaged.problems else "walked"] += 1
        # a walk may find no problem: what it found is each one line
        assert not [problem for problem in damaged.problems if not (isinstance(problem, str) and problem)]
        assert len(damaged.addresses) == len(damaged.usable) == len(damaged.mmapped)
        inside = np.zeros(len(damaged.addresses), dtype=bool)
        for low, high in ranges:
            inside |= (damaged.addresses >= low) & (damaged.addresses < high)
        assert inside.all(), "a block outside the copy's memory"
    print(outcomes)
    assert outcomes["with problems"] + outcomes["refused"] > 0
