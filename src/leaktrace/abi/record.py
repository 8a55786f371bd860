# Generated from abi/record.h by abi/layout_gen.py; tests/unit/test_layouts.py checks it.
import struct

MAX_FRAMES = 256
RECORD_INHERITED = 1
RECORD_UNTRACED = 2
TABLE_SHARDS = 16
SITE_SLOTS = 4
SITE_SHARDS = 16
SHARD_SITES_MOST = 262144
OWN_MAPS = 256
PYTHON_CODES = 4096
PYTHON_TEXT = 0x100000
PYTHON_TABLE_MOST = 0x4000

RECORD = struct.Struct('<QQIIQQ')   # pointer, size, flags, frame_count, frames, site

SITE = struct.Struct('<IIQQQ32s')   # frame_count, unused, hash, size, frames, pad

SITE_COUNTS = struct.Struct('<IIqQQQqQ8s')   # lock, unused, live, allocations, frees, short_lived, peak_live, peak_epoch, pad

SITE_SHARD = struct.Struct('<IIQQQ32s')   # lock, unused, slots, slot_count, used, pad

OWN_MAP = struct.Struct('<QQ')   # start, end

TABLE_SHARD = struct.Struct('<IIQQQQQQ72s')   # lock, unused, records, slots, used, live, allocations, frees, pad

PYTHON_CODE_TABLE = struct.Struct('<IIQ')   # lock, count, text_used

PYTHON_CODE = struct.Struct('<QQQIIIIIHH')   # code, fields, text, first_line, changed, name_length, file_length, table_length, name_kind, file_kind
