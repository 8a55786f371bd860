# Generated from abi/layout.h by abi/layout_gen.py; tests/unit/test_layouts.py checks it.
import struct

STACK_NONE = 0
STACK_LOST = 1
FIRST_STACK_KEY = 2
COOKIE_FUNCTION_BITS = 8
COOKIE_REGISTER_BITS = 4
PEAK_STEP_PERCENT = 1
IGNORED_UNSELECTED = 1
IGNORED_TRACER = 2
CTL_EXIT_STOP = 0
CTL_NEXT_GEN = 1
CTL_FORKS = 2
CTL_COPIES_DONE = 3
CTL_TARGET_GEN = 4
CTL_TEXT_BEFORE_FREE = 5
CTL_TEXT_AFTER_FREE = 6
CTL_TABLES_STOP = 7
CTL_TABLES_GEN = 8
CTL_HOLDS_OFF = 9
CTL_JUDGE_EXITS = 10
CTL_INTERPRETER_STOP = 11
CTL_SLOTS = 12
NO_TABLES_STOP = 0xffffffff
HOLD_WAITING = 1
HOLD_RELEASED = 2
HOLD_AT_EXIT = 3
STOP_OWNERS_MAX = 4096

C_ALLOCS = 0
C_FREES = 1
C_LIVE_FULL = 2
C_SITE_FULL = 3
C_STACK_FULL = 4
C_STACK_COLLISION = 5
C_PENDING_LOST = 6
C_STALE_CALL = 7
C_UNKNOWN_FREE = 8
C_INTERNAL_FREE = 9
C_MISSED_FREE = 10
C_NESTED = 11
C_UNFOLLOWED = 12
C_INHERIT_LOST = 13
C_PYTHON_CUT = 14
C_PYTHON_CODES_FULL = 15
C_STOPS_UNSHARED = 16
C_PEAK_FULL = 17
C_STACK_TRUNCATED = 18
C_TRUNCATED_NO_TABLES = 19
C_TRUNCATED_UNKNOWN_CODE = 20
C_TRUNCATED_UNREADABLE_STACK = 21
C_TRUNCATED_BAD_FRAME = 22
C_TRUNCATED_NO_RULE = 23
C_TRUNCATED_WALK_BUDGET = 24
C_TRUNCATED_NOT_ENTERED = 25
C_COUNTERS = 26
COUNTER_FIELDS = (   # the Python names, in the enum's order
    'allocations',
    'frees',
    'live_map_full',
    'site_map_full',
    'stack_map_full',
    'stack_collisions',
    'pending_lost',
    'stale_calls',
    'unknown_frees',
    'internal_frees',
    'missed_frees',
    'nested_calls',
    'unfollowed_children',
    'inheritance_lost',
    'python_frames_cut',
    'python_codes_full',
    'stops_unshared',
    'peak_map_full',
    'stacks_truncated',
    'stacks_truncated_no_tables',
    'stacks_truncated_unknown_code',
    'stacks_truncated_unreadable_stack',
    'stacks_truncated_bad_frame',
    'stacks_truncated_no_rule',
    'stacks_truncated_walk_budget',
    'stacks_truncated_not_entered',
)

AR_ABI = 0
AR_RAX = 1
AR_RBX = 2
AR_RCX = 3
AR_RDX = 4
AR_RSI = 5
AR_RDI = 6
AR_R8 = 7
AR_R9 = 8
AR_R10 = 9
AR_R11 = 10
AR_R12 = 11
AR_R13 = 12
AR_R14 = 13
AR_R15 = 14

F_MALLOC = 0
F_CALLOC = 1
F_REALLOC = 2
F_REALLOCARRAY = 3
F_POSIX_MEMALIGN = 4
F_ALIGNED_ALLOC = 5
F_VALLOC = 6
F_PVALLOC = 7

LIVE_KEY = struct.Struct('<IIQ')   # tgid, gen, addr

LIVE_VAL = struct.Struct('<QQQII')   # size, ts_ns, stack_key, inherited, tombstone

SITE_KEY = struct.Struct('<IIQQ')   # tgid, gen, stack_key, size

SITE_VAL = struct.Struct('<qQQQqQ')   # live, allocations, frees, short_lived, peak_live, peak_epoch

PEAK = struct.Struct('<qQQQQQQ')   # live_bytes, peak_bytes, peak_ns, epoch, epoch_bytes, epoch_ns, unpublished

PROC = struct.Struct('<IIII16sIIII')   # gen, exited, parent, execed, comm, uid, ignored, inheritance_lost, whole

HOLD = struct.Struct('<II')   # gen, state

STOP_OWNER = struct.Struct('<II')   # tgid, stopper
