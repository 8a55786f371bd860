"""The glibc heap walk on processes that ran untraced: `-p PID --unreachable` judges every
block of the heap, held to valgrind's "definitely" + "indirectly lost" for the same program
(sizes rounded to glibc's usable sizes), the walk's blocks equal the preload library's table,
and `leaktrace heap` reports the heap with no probe attached."""

from __future__ import annotations

import ctypes
import json
import re
import signal
import subprocess
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
from each import each

from leaktrace.model.snapshot import request_range
from leaktrace.platform.process import read_process
from leaktrace.reachability.glibc_heap import walk_heap
from leaktrace.reachability.unreachable import scanned_mapping
from leaktrace.sources.preload.table import copy_with_table
from leaktrace.sources.preload.trace import PreloadTrace

from conftest import leaktrace_command
from helpers import TIMEOUT

JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
PAGE = 4096


def glibc_usable(request: int) -> int:
    """malloc_usable_size of a block of this request in a process whose mmap threshold is
    glibc's default (128 KiB): written from malloc.c's request2size and sysmalloc."""
    chunk = max(32, (request + 8 + 15) & ~15)
    if request >= 128 << 10:
        return ((chunk + 8 + PAGE - 1) & ~(PAGE - 1)) - 16
    return chunk - 8


# old_leaks.c's `held`: only an interior pointer holds it, which leaktrace (as libmemunreachable)
# counts as a reference and valgrind as "possibly lost".
HELD_BY_INTERIOR = 200
LOST_KINDS = ("Leak_DefinitelyLost", "Leak_IndirectlyLost", "Leak_PossiblyLost")


def valgrind_lost_usable(argv: list[str]) -> tuple[int, int]:
    """(bytes, blocks) valgrind calls lost at exit, each loss record's blocks (one call site,
    one size in these programs) rounded to glibc's usable size. Possibly lost counts but for
    `held`: valgrind's heap sits at low addresses (0x4a00000 and up), where a stray number
    (a nanosecond count) can point into a block; 1 run in 60 under load took old_leaks.c's 1 MiB
    leak for possibly lost that way."""
    xml = Path(subprocess.run(["mktemp"], capture_output=True, text=True, check=True).stdout.strip())
    try:
        result = subprocess.run(
            [
                "valgrind",
                "--leak-check=full",
                "--show-leak-kinds=definite,indirect,possible",
                "--xml=yes",
                f"--xml-file={xml}",
                *argv,
            ],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert result.returncode == 0, result.stderr
        total_bytes = total_blocks = 0
        for error in ElementTree.parse(xml).getroot().iter("error"):
            if error.findtext("kind") not in LOST_KINDS:
                continue
            leaked, blocks = int(error.findtext("xwhat/leakedbytes")), int(error.findtext("xwhat/leakedblocks"))
            if error.findtext("kind") == "Leak_PossiblyLost" and leaked == HELD_BY_INTERIOR * blocks:
                continue
            direct = re.search(r"\(([\d,]+) direct, [\d,]+ indirect\)", error.findtext("xwhat/text"))
            if direct:  # the blocks it holds have records of their own
                leaked = int(direct.group(1).replace(",", ""))
            assert leaked % blocks == 0, "a loss record of several sizes"
            total_bytes += blocks * glibc_usable(leaked // blocks)
            total_blocks += blocks
        return total_bytes, total_blocks
    finally:
        xml.unlink()


class Untraced:
    """A program started with no tracer, waiting in its "wait" mode until killed."""

    def __init__(self, argv: list[str], ready: Path, preload: bool = False):
        if preload:
            self.trace = PreloadTrace.launch(argv, "backtrace=16")
            self.pid = self.trace.pid
        else:
            self.trace = None
            self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
            self.pid = self.process.pid
        deadline = time.monotonic() + TIMEOUT
        while not ready.exists() or not ready.read_text().endswith("\n"):
            assert time.monotonic() < deadline, "the program never became ready"
            time.sleep(0.02)

    def __enter__(self) -> Untraced:
        return self

    def __exit__(self, *exc) -> None:
        if self.trace:
            self.trace.close()
            subprocess.run(["kill", "-KILL", str(self.pid)], check=False)
        else:
            self.process.kill()
            self.process.wait()


def test_request_range_holds_every_request_glibc_serves_with_that_usable_size():
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc_usable_size.argtypes = [ctypes.c_void_p]
    libc.free.argtypes = [ctypes.c_void_p]
    for request in [*range(0, 2100), 4096, 65536, 200000, 1 << 20, (1 << 20) + 1]:
        block = libc.malloc(request)
        usable = libc.malloc_usable_size(block)
        libc.free(block)
        low, high = request_range(usable)
        assert low <= max(request, 1) <= high, (request, usable)


SHAPES = [
    ("old_leaks", ()),
    ("unreachable", ("chain",)),
    ("unreachable", ("ring",)),
    ("unreachable", ("headed_ring",)),
    ("unreachable", ("diamond",)),
    ("unreachable", ("global",)),
]


@pytest.mark.parametrize("name,mode", SHAPES, ids=["-".join((n, *m)) for n, m in SHAPES])
def test_old_leaks_of_an_untraced_process_match_valgrind(program, tmp_path, name, mode):
    binary = str(program(name))
    ready = tmp_path / "ready"
    argv = [binary, "wait", str(ready)] if name == "old_leaks" else [binary, *mode, str(ready)]
    exit_argv = [binary, "exit"] if name == "old_leaks" else [binary, *mode, "exit"]
    with Untraced(argv, ready) as target:
        result = subprocess.run(
            leaktrace_command("-p", str(target.pid), "--unreachable", "--json", "0.3", "1"),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout.splitlines()[-1])["unreachable"]
        text = subprocess.run(
            leaktrace_command("-p", str(target.pid), "--unreachable", "0.3", "1"),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    assert report["complete"] and not report["walk_problems"]
    assert report["heap_walk"].startswith("heap walk (glibc 2.36): ")
    assert (report["leak_bytes"], report["num_leaks"]) == valgrind_lost_usable(exit_argv)
    assert report["before_trace"] == report["num_allocations"]  # nothing was allocated during the trace
    assert all(leak["stack_status"] == "before_trace" and not leak["frames"] for leak in each(report["leaks"]))
    lows_highs = [request_range(leak["size"]) for leak in report["leaks"]]
    low, high = min(r[0] for r in lows_highs), max(r[1] for r in lows_highs)
    seed = f"backtrace_size={low}" if low == high else f"backtrace_min_size={low} backtrace_max_size={high}"
    assert report["seed_options"] == seed
    assert text.stdout.rstrip().endswith(f"to take stacks of only these sizes: --options '{seed}'")
    assert "allocated before the trace: no stack, and the size is glibc's usable size" in text.stdout


def test_blocks_made_during_the_trace_keep_their_stacks(program, tmp_path):
    """A target that leaks again once traced: the new leak has its stack and exact sizes, the
    old ones are found by the walk; every block is judged once."""
    binary = str(program("old_leaks"))
    ready = tmp_path / "ready"
    with Untraced([binary, "wait", str(ready)], ready) as target:
        tool = subprocess.Popen(
            leaktrace_command("-p", str(target.pid), "--unreachable", "--json", "4", "1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + TIMEOUT
        while "probes live" not in tool.stderr.readline():
            assert time.monotonic() < deadline and tool.poll() is None
        target.process.send_signal(signal.SIGUSR1)  # a list of 3 nodes, made and leaked while traced
        out, err = tool.communicate(timeout=TIMEOUT)
        assert tool.returncode == 0, err
    report = json.loads(out.splitlines()[-1])["unreachable"]
    old_bytes, old_blocks = valgrind_lost_usable([binary, "exit"])
    assert (report["leak_bytes"], report["num_leaks"]) == (old_bytes + 3 * 56, old_blocks + 3)
    [new] = [leak for leak in report["leaks"] if leak["stack_status"] == "captured"]
    assert (new["size"], new["referenced_count"], new["referenced_size"]) == (56, 2, 112)
    assert new["frames"][0]["function"] == "leak_list"
    assert report["before_trace"] == report["num_allocations"] - 3


def test_walk_equals_the_preload_table(program, tmp_path):
    """Block for block: the program's blocks are the library's table, exactly, and the rest of
    the heap is the library's own: the shards' arrays (its sites and their frames are in
    memory it maps itself)."""
    binary = str(program("old_leaks"))
    ready = tmp_path / "ready"
    with Untraced([binary, "wait", str(ready)], ready, preload=True) as target:
        image, allocations, table = copy_with_table(target.pid, scanned_mapping)
        walk = walk_heap(read_process(target.pid), image)
        again = walk_heap(read_process(target.pid), image, use_debug_file=False)
    assert walk.complete
    found = dict(zip(walk.addresses.tolist(), walk.usable.tolist()))
    for allocation in allocations:
        low, high = request_range(found.pop(allocation.address))
        assert low <= allocation.size <= high
    for start, end in table.occupied:  # each shard's array of slots
        assert found.pop(start) >= end - start
    assert found == {}
    assert sorted(table.own_blocks()) == sorted(start for start, _ in table.occupied)
    # Without libc's symbols: main_arena and the tcache found by their shapes, the same blocks.
    assert "by its shape" in again.method and "offset found by shape" in again.method
    assert again.addresses.tolist() == walk.addresses.tolist() and again.complete


def test_heap_command(program, tmp_path):
    binary = str(program("old_leaks"))
    ready = tmp_path / "ready"
    with Untraced([binary, "wait", str(ready)], ready) as target:
        text = subprocess.run(
            leaktrace_command("heap", "-p", str(target.pid)), capture_output=True, text=True, timeout=TIMEOUT
        )
        result = subprocess.run(
            leaktrace_command("heap", "-p", str(target.pid), "--unreachable", "--json"),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        leaks_text = subprocess.run(
            leaktrace_command("heap", "-p", str(target.pid), "--unreachable"),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert target.process.poll() is None  # it runs on
    # No trace ran: the words say what the walk did, and leaks of one size and contents are one entry.
    assert "no trace ran" in leaks_text.stdout and "before the trace" not in leaks_text.stdout
    assert "the trace had not seen" not in leaks_text.stdout
    assert text.returncode == 0 and result.returncode == 0, text.stderr + result.stderr
    heap = json.loads(result.stdout)
    # old_leaks' blocks (tests/integration/programs/old_leaks.c), by usable size; 4104: stdout's buffer,
    # 280: the two threads' TLS vectors (dtv) kept with their cached stacks.
    expected = {
        24: 10,
        56: 17,
        72: 2,
        104: 16,
        200: 1,
        312: 4,
        4104: 1,
        280: 2,
        glibc_usable(1 << 20): 1,
        glibc_usable(3 << 19): 1,
    }
    assert {row["size"]: row["blocks"] for row in heap["size_classes"]} == expected
    assert heap["blocks"] == sum(expected.values())
    assert heap["bytes"] == sum(size * count for size, count in expected.items())
    assert heap["mmapped"] == {"blocks": 2, "bytes": glibc_usable(1 << 20) + glibc_usable(3 << 19)}
    assert len(heap["arenas"]) == 3 and heap["arenas"][0]["main"] and heap["complete"]
    assert sum(a["blocks"] for a in heap["arenas"]) + 2 == heap["blocks"]
    assert (heap["unreachable"]["leak_bytes"], heap["unreachable"]["num_leaks"]) == valgrind_lost_usable(
        [binary, "exit"]
    )
    entries = heap["unreachable"]["leaks"]
    assert len({(leak["size"], leak["contents"]) for leak in entries}) == len(entries)
    first = text.stdout.splitlines()[0]
    assert re.fullmatch(
        rf"heap of pid {target.pid} \(old_leaks\), glibc 2\.36: {heap['bytes']} bytes in "
        rf"{heap['blocks']} blocks in use \(usable sizes\); the process stood still [\d.]+ ms, the "
        r"walk took [\d.]+ ms",
        first,
    )
    assert "main_arena from libc's symbols; tcaches through each thread's TLS" in text.stdout


def test_a_corrupted_heap_gives_a_partial_result_marked_incomplete(program, tmp_path):
    binary = str(program("old_leaks"))
    ready = tmp_path / "ready"
    with Untraced([binary, "wait", str(ready), "corrupt"], ready) as target:
        heap = subprocess.run(
            leaktrace_command("heap", "-p", str(target.pid), "--json"), capture_output=True, text=True, timeout=TIMEOUT
        )
        traced = subprocess.run(
            leaktrace_command("-p", str(target.pid), "--unreachable", "0.3", "1"),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    assert heap.returncode == 0 and traced.returncode == 0, heap.stderr + traced.stderr
    assert "Traceback" not in heap.stderr + traced.stderr
    summary = json.loads(heap.stdout)
    assert not summary["complete"]
    problem = summary["problems"][0]  # then the free lists that run into the part not walked
    assert re.fullmatch(
        r"main arena: the chunk at 0x[0-9a-f]+ has size 0x7fff0, which runs past 0x[0-9a-f]+: "
        r"the rest of this heap was not walked",
        problem,
    )
    assert f"heap walk incomplete: {problem}" in traced.stdout
    assert "blocks allocated before the trace began are not all known" in traced.stdout


def test_the_walk_is_glibc_s(build_dir, tmp_path):
    binary = build_dir / "old_leaks_jemalloc"
    subprocess.run(
        ["gcc", "-O0", "-g", "-pthread", "-o", str(binary), "tests/integration/programs/old_leaks.c", JEMALLOC],
        check=True,
    )
    ready = tmp_path / "ready"
    with Untraced([str(binary), "wait", str(ready)], ready) as target:
        heap = subprocess.run(
            leaktrace_command("heap", "-p", str(target.pid)), capture_output=True, text=True, timeout=TIMEOUT
        )
        traced = subprocess.run(
            leaktrace_command("-p", str(target.pid), "--unreachable", "0.3", "1"),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    assert heap.returncode == 1 and heap.stdout == ""
    assert heap.stderr == (f"leaktrace: pid {target.pid} allocates with {JEMALLOC}: the heap walk is glibc's\n")
    assert traced.returncode == 0, traced.stderr
    assert f"  no heap walk: pid {target.pid} allocates with {JEMALLOC}: the heap walk is glibc's\n" in traced.stdout
    assert "blocks allocated before the trace began are not all known" in traced.stdout
