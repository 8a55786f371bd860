// The layout leaktrace.bpf.c and user space share: counters, allocating functions, the
// control slots, map keys and values (the unwind rows are unwind/rows.h's). The one source of truth: layout_gen.py
// writes the Python side (layout.py) from this file, and a test fails when it is stale.
// Kept to what layout_gen.py reads: #define NAME NUMBER, enums (a counter's comment
// starts with its Counters field name), structs of u8/s16/u16/u32/s32/u64 and char[N].
#ifndef LEAKTRACE_LAYOUT_H
#define LEAKTRACE_LAYOUT_H

// Stack keys below FIRST_STACK_KEY are not hashes: they say why there is no stack.
#define STACK_NONE 0  // size outside the backtrace size range: counted, no stack
#define STACK_LOST 1  // a stack was wanted but could not be stored (see counters)
#define FIRST_STACK_KEY 2

enum counter {
    C_ALLOCS,           // allocations: allocations recorded
    C_FREES,            // frees: frees of recorded allocations
    C_LIVE_FULL,        // live_map_full: allocation not recorded: live map full
    C_SITE_FULL,        // site_map_full: allocation not recorded: site map full
    C_STACK_FULL,       // stack_map_full: stack lost: stack map full
    C_STACK_COLLISION,  // stack_collisions: stack lost: another stack has the same hash
    C_PENDING_LOST,     // pending_lost: call lost: its per-thread record could not be created
    C_STALE_CALL,       // stale_calls: a call whose return was never seen was replaced
    C_UNKNOWN_FREE,     // unknown_frees: free/realloc by the program of an address that is not recorded
    C_INTERNAL_FREE,    // internal_frees: free by the allocator's own code of a block it kept (glibc's tcache)
    C_MISSED_FREE,      // missed_frees: an address came back from the allocator while still recorded
    C_NESTED,           // nested_calls: allocator call made from inside another one (ignored)
    C_UNFOLLOWED,       // unfollowed_children: process not traced: procs map full (each counted once)
    C_INHERIT_LOST,  // inheritance_lost: child that ran without its inherited blocks (too many copies waited at its fork)
    C_PYTHON_CUT,    // python_frames_cut: a stack's Python frames cut at PYTHON_MAX_FRAMES (its native frames whole)
    C_PYTHON_CODES_FULL,  // python_codes_full: code objects the preload library had no room to keep (their frames show no name)
    C_STOPS_UNSHARED,   // stops_unshared: a process stopped with no entry in the shared stop_owners map (it was full)
    C_PEAK_FULL,        // peak_map_full: a process's peak not followed: peak map full
    C_STACK_TRUNCATED,  // stacks_truncated: a stack ended early: a frame the walk could not follow or trust
    // Why, one counter each (their sum is stacks_truncated):
    C_TRUNCATED_NO_TABLES,     // stacks_truncated_no_tables: the process's unwind tables were not in yet
    C_TRUNCATED_UNKNOWN_CODE,  // stacks_truncated_unknown_code: a return address in no executable mapping the walk knows
    C_TRUNCATED_UNREADABLE_STACK,  // stacks_truncated_unreadable_stack: a read of the stack failed
    C_TRUNCATED_BAD_FRAME,         // stacks_truncated_bad_frame: a rule's frame address not above the stack pointer
    C_TRUNCATED_NO_RULE,  // stacks_truncated_no_rule: no CFI row at the pc, and the frame-pointer chain did not check out
    C_TRUNCATED_WALK_BUDGET,  // stacks_truncated_walk_budget: the kernel's tail calls ran out before the frame limit
    C_TRUNCATED_NOT_ENTERED,  // stacks_truncated_not_entered: the unwinder program could not be entered
    C_COUNTERS,
};

// A probe's cookie: the allocating function (alloc_enter's; 0 for free_enter) in its low
// COOKIE_FUNCTION_BITS, then for each argument (the first, second, third) where the
// probe finds it, COOKIE_REGISTER_BITS each: a probe placed past the entry may find an
// argument moved to another register (mimalloc's malloc: `mov rsi, rdi`).
#define COOKIE_FUNCTION_BITS 8
#define COOKIE_REGISTER_BITS 4

enum argument_register {
    AR_ABI,  // still in the register the calling convention put it in
    AR_RAX,
    AR_RBX,
    AR_RCX,
    AR_RDX,
    AR_RSI,
    AR_RDI,
    AR_R8,
    AR_R9,
    AR_R10,
    AR_R11,
    AR_R12,
    AR_R13,
    AR_R14,
    AR_R15,
};

// The allocating functions, as cookies of alloc_enter's probes.
enum function {
    F_MALLOC,
    F_CALLOC,
    F_REALLOC,
    F_REALLOCARRAY,
    F_POSIX_MEMALIGN,
    F_ALIGNED_ALLOC,  // and memalign
    F_VALLOC,
    F_PVALLOC,
};

struct live_key {
    u32 tgid;
    u32 gen;
    u64 addr;
};

struct live_val {
    u64 size;
    u64 ts_ns;  // allocation time; for a tombstone, when it was freed
    u64 stack_key;
    u32 inherited;  // allocated by an ancestor before the fork
    u32 tombstone;  // an inherited block this process freed before its copy was made
};

struct site_key {
    u32 tgid;
    u32 gen;
    u64 stack_key;
    u64 size;
};

// A site's figures: live now, and its totals since the trace began.
struct site_val {
    s64 live;         // blocks live now
    u64 allocations;  // blocks made
    u64 frees;        // of those, freed
    u64 short_lived;  // freed before their thread's next allocation (heaptrack's temporary ones)
    s64 peak_live;    // blocks live when its process set peak epoch peak_epoch (see struct peak)
    u64 peak_epoch;
};

// A process image's live bytes and their high-water mark. The epoch moves on when the live
// bytes pass the last epoch's by PEAK_STEP_PERCENT or more; each site keeps its count as of
// the latest epoch, copied at its first change after it (so the sites at the peak are those
// of a moment less than PEAK_STEP_PERCENT below it).
struct peak {
    s64 live_bytes;
    u64 peak_bytes;
    u64 peak_ns;  // when peak_bytes was reached (bpf_ktime_get_ns)
    u64 epoch;
    u64 epoch_bytes;  // the live bytes when the epoch began
    u64 epoch_ns;
    u64 unpublished;  // the preload library: live bytes its threads may not have added yet (BPF: 0)
};
#define PEAK_STEP_PERCENT 1

struct proc {
    u32 gen;
    u32 exited;
    u32 parent;            // the tgid it was forked from (0: the target, or first seen with --all)
    u32 execed;            // it has exec'd since
    char comm[16];         // as of its fork or exec: names a process that dies before user space looks
    u32 uid;               // real uid as of its fork, exec or first call (for --uid)
    u32 ignored;           // IGNORED_*: known, but not traced
    u32 inheritance_lost;  // forked with no copy slot: counted at its first call unless it execs first
    u32 whole;  // all its blocks known: started or exec'd under the trace, or forked from such with its inheritance
};
#define IGNORED_UNSELECTED 1  // user space found it outside --comm/--uid/--pid-filter; exec clears it
#define IGNORED_TRACER 2      // a process leaktrace started itself (addr2line): never traced

// The control array's slots (see leaktrace.bpf.c for what each one means).
#define CTL_EXIT_STOP 0
#define CTL_NEXT_GEN 1
#define CTL_FORKS 2
#define CTL_COPIES_DONE 3
#define CTL_TARGET_GEN 4
#define CTL_TEXT_BEFORE_FREE 5
#define CTL_TEXT_AFTER_FREE 6
#define CTL_TABLES_STOP 7
#define CTL_TABLES_GEN 8
#define CTL_HOLDS_OFF 9
#define CTL_JUDGE_EXITS 10  // --leak-check with -f or --all: processes whose blocks are all known are held in _exit
#define CTL_INTERPRETER_STOP 11  // stopped where its interpreter frees its code: that code is read first
#define CTL_SLOTS 12
#define NO_TABLES_STOP 0xffffffff

// A program stopped at its first allocator call until its unwind tables are in (-f, --all).
struct hold {
    u32 gen;    // its image
    u32 state;  // HOLD_*
};
#define HOLD_WAITING 1   // stopped (or about to be): user space continues it
#define HOLD_RELEASED 2  // continued: not held again for this image
#define HOLD_AT_EXIT 3   // stopped in _exit: user space judges its blocks, then continues it

// A process one leaktrace stopped, in the map every leaktrace shares (stop_owners.py): the
// last stopper to let it go continues it.
struct stop_owner {
    u32 tgid;
    u32 stopper;  // the leaktrace's pid
};
#define STOP_OWNERS_MAX 4096

#endif
