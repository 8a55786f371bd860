# Generated from sources/preload/native/record.h by sources/bpf/layout_gen.py; tests/unit/test_layouts.py checks it.
import struct

MAX_FRAMES = 256
RECORD_INHERITED = 1
RECORD_UNTRACED = 2
TABLE_SHARDS = 16

RECORD = struct.Struct('<QQIIQ')   # pointer, size, flags, frame_count, frames

TABLE_SHARD = struct.Struct('<IIQQQQQQ72s')   # lock, unused, records, slots, used, live, allocations, frees, pad
