"""The Python frames bench's workload: `bytearray(SIZE)` CALLS times (a malloc and a free of
SIZE bytes each: above pymalloc's 512), DEPTH Python calls below the module; then the
timing line run_bench.py reads.

    python3.11 bench/python_alloc.py DEPTH CALLS [SIZE]
"""

import sys
import time


def below(depth, work):
    return below(depth - 1, work) if depth else work()


def allocate(calls, size):
    start = time.perf_counter_ns()
    for _ in range(calls):
        bytearray(size)
    return time.perf_counter_ns() - start


depth, calls = int(sys.argv[1]), int(sys.argv[2])
size = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
elapsed = below(depth, lambda: allocate(calls, size))
print(f"calls {calls} ns {elapsed}")
