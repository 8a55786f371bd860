// leaktrace's in-kernel half: uprobes on an allocator keep the live-allocation
// table, a table of unique user stacks and per-(tgid, stack, size) counts.
// Every handler does O(1) map work (plus one pass over the stack it just
// walked); everything else happens in user space.
//
// Compile-time parameters (set by tracer/bpf_engine.py with -D):
//   TARGET_TGID    process to trace, 0 for every process
//   STACK_DEPTH    frames kept per stack (the caller's return address + the rest)
//   LT_SIZE_MIN    smallest size that gets a stack (inclusive)
//   LT_SIZE_MAX    largest size that gets a stack (inclusive)
//   PAGE_BYTES     the page size, for pvalloc
//   TEXT_BEFORE_FREE, TEXT_AFTER_FREE   extent of the allocator's code around free
//   MAX_LIVE, MAX_SITES, MAX_STACKS, MAX_PENDING   map capacities
#include <uapi/linux/ptrace.h>

// Stack keys below FIRST_STACK_KEY are not hashes: they say why there is no stack.
#define STACK_NONE 0       // size outside the backtrace size range: counted, no stack
#define STACK_LOST 1       // a stack was wanted but could not be stored (see counters)
#define FIRST_STACK_KEY 2

enum counter {
    C_ALLOCS,           // allocations recorded
    C_FREES,            // frees of recorded allocations
    C_LIVE_FULL,        // allocation not recorded: live map full
    C_SITE_FULL,        // allocation not recorded: site map full
    C_STACK_FULL,       // stack lost: stack map full
    C_STACK_COLLISION,  // stack lost: another stack has the same hash
    C_STACK_ERROR,      // kernel stack walk failed (the caller frame is still kept)
    C_PENDING_FULL,     // call lost: per-thread pending-call map full
    C_STALE_CALL,       // a call whose return was never seen was replaced
    C_UNKNOWN_FREE,     // free/realloc by the program of an address that is not recorded
    C_INTERNAL_FREE,    // free by the allocator's own code of a block it kept (glibc's tcache)
    C_MISSED_FREE,      // an address came back from the allocator while still recorded
    C_NESTED,           // allocator call made from inside another one (ignored)
    C_COUNTERS,
};

enum call_kind {
    K_ALLOC,            // malloc, calloc, aligned_alloc, memalign, valloc, pvalloc
    K_REALLOC,          // realloc, reallocarray
    K_POSIX_MEMALIGN,
};

struct live_key {
    u32 tgid;
    u32 pad;
    u64 addr;
};

struct live_val {
    u64 size;
    u64 ts_ns;
    u64 stack_key;
};

struct site_key {
    u32 tgid;
    u32 pad;
    u64 stack_key;
    u64 size;
};

struct stack_val {
    u64 ip[STACK_DEPTH];
};

// One allocator call in flight on a thread; nested and tail calls are
// recognised by a stack pointer at or below entry_sp, and the matching return
// by entry_sp + 8.
struct pending_call {
    u64 entry_sp;
    u64 size;
    u64 arg;              // realloc: old pointer; posix_memalign: memptr
    u64 stack_key;
    u32 kind;
    u32 has_old;          // realloc removed a recorded block at entry
    struct live_val old;
};

BPF_HASH(live, struct live_key, struct live_val, MAX_LIVE);
BPF_HASH(sites, struct site_key, s64, MAX_SITES);
BPF_HASH(stacks, u64, struct stack_val, MAX_STACKS);
BPF_HASH(pending, u32, struct pending_call, MAX_PENDING);
BPF_PERCPU_ARRAY(counters, u64, C_COUNTERS);
BPF_PERCPU_ARRAY(stack_scratch, struct stack_val, 1);
// [CTL_ARMED] = 1 once the target runs its own image (at once for -p, at exec for -c);
// [CTL_EXIT_STOP] = 1 once exit_stop has stopped the target in _exit.
#define CTL_ARMED 0
#define CTL_EXIT_STOP 1
BPF_ARRAY(control, u32, 2);

static __always_inline void count(u32 which)
{
    u64 *value = counters.lookup(&which);
    if (value)
        *value += 1;
}

static __always_inline int traced(u32 tgid)
{
    u32 slot = CTL_ARMED;
    u32 *armed = control.lookup(&slot);
    if (!armed || !*armed)
        return 0;
    return TARGET_TGID == 0 || tgid == TARGET_TGID;
}

static __always_inline int wants_stack(u64 size)
{
    return size >= LT_SIZE_MIN && size <= LT_SIZE_MAX;
}

// Returns 0 when the site map is full and the count could not be kept.
static __always_inline int site_add(u32 tgid, u64 stack_key, u64 size, s64 delta)
{
    struct site_key key = {.tgid = tgid, .stack_key = stack_key, .size = size};
    s64 *value = sites.lookup(&key);
    if (!value) {
        s64 zero = 0;
        sites.insert(&key, &zero);   // fails on a racing insert (harmless) or a full map
        value = sites.lookup(&key);
        if (!value) {
            count(C_SITE_FULL);
            return 0;
        }
    }
    __sync_fetch_and_add(value, delta);
    return 1;
}

static __always_inline void live_add(u32 tgid, u64 addr, u64 size, u64 stack_key, u64 ts_ns)
{
    struct live_key key = {.tgid = tgid, .addr = addr};
    struct live_val *stale = live.lookup(&key);
    if (stale) {
        // The allocator handed out an address we still hold: its free went unseen.
        site_add(tgid, stale->stack_key, stale->size, -1);
        count(C_MISSED_FREE);
    }
    struct live_val val = {.size = size, .ts_ns = ts_ns, .stack_key = stack_key};
    if (live.update(&key, &val) != 0) {
        count(C_LIVE_FULL);
        return;
    }
    if (!site_add(tgid, stack_key, size, 1)) {
        live.delete(&key);   // recorded nowhere rather than half-recorded
        return;
    }
    count(C_ALLOCS);
}

// Removes a recorded block; returns 1 and its record in *out when it was there.
static __always_inline int live_remove(u32 tgid, u64 addr, struct live_val *out)
{
    struct live_key key = {.tgid = tgid, .addr = addr};
    struct live_val *val = live.lookup(&key);
    if (!val)
        return 0;
    *out = *val;
    if (live.delete(&key) != 0)
        return 0;   // a racing free of the same block took it
    site_add(tgid, out->stack_key, out->size, -1);
    count(C_FREES);
    return 1;
}

// Stores the user stack of the current call and returns its key. Frame 0 is
// the return address at *sp, which a frame-pointer walk from a function's
// first instruction cannot see; the kernel walk supplies the frames above it.
static __always_inline u64 capture_stack(struct pt_regs *ctx)
{
    u32 zero = 0;
    struct stack_val *scratch = stack_scratch.lookup(&zero);
    if (!scratch)
        return STACK_LOST;
    u64 caller = 0;
    bpf_probe_read_user(&caller, sizeof(caller), (void *)PT_REGS_SP(ctx));
    scratch->ip[0] = caller;
    long walked = 0;
#if STACK_DEPTH > 1
    // Skip 1: the walk starts at the probed instruction itself.
    walked = bpf_get_stack(ctx, &scratch->ip[1], (STACK_DEPTH - 1) * sizeof(u64),
                           BPF_F_USER_STACK | 1);
    if (walked < 0) {
        count(C_STACK_ERROR);
        walked = 0;
    }
#endif
    u32 frames = 1 + walked / sizeof(u64);
    u64 hash = 0xcbf29ce484222325ULL;
    for (u32 i = 0; i < STACK_DEPTH; i++) {
        if (i >= frames)
            scratch->ip[i] = 0;
        hash = (hash ^ scratch->ip[i]) * 0x100000001b3ULL;
        hash ^= hash >> 29;
    }
    if (hash < FIRST_STACK_KEY)
        hash += FIRST_STACK_KEY;

    struct stack_val *known = stacks.lookup(&hash);
    if (!known) {
        int err = stacks.insert(&hash, scratch);
        if (err == 0)
            return hash;
        known = stacks.lookup(&hash);   // a racing insert of the same hash
        if (!known) {
            count(C_STACK_FULL);
            return STACK_LOST;
        }
    }
    for (u32 i = 0; i < STACK_DEPTH; i++) {
        if (known->ip[i] != scratch->ip[i]) {
            count(C_STACK_COLLISION);
            return STACK_LOST;
        }
    }
    return hash;
}

static __always_inline int enter_call(struct pt_regs *ctx, u32 kind, u64 size, u64 arg)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    if (!traced(tgid))
        return 0;
    u64 sp = PT_REGS_SP(ctx);
    struct pending_call *outer = pending.lookup(&tid);
    if (outer) {
        // Equal sp: a tail call (glibc's reallocarray jumps to realloc).
        if (sp <= outer->entry_sp) {
            count(C_NESTED);
            return 0;
        }
        count(C_STALE_CALL);
    }

    struct pending_call call = {.entry_sp = sp, .size = size, .arg = arg, .kind = kind};
    call.stack_key = wants_stack(size) ? capture_stack(ctx) : STACK_NONE;
    // realloc releases the old block before it returns; forget it now so that
    // another thread can be handed the same address without a clash.
    if (kind == K_REALLOC && arg) {
        call.has_old = live_remove(tgid, arg, &call.old);
        if (!call.has_old)
            count(C_UNKNOWN_FREE);
    }
    if (pending.update(&tid, &call) != 0) {
        count(C_PENDING_FULL);
        if (call.has_old)
            live_add(tgid, arg, call.old.size, call.old.stack_key, call.old.ts_ns);
    }
    return 0;
}

static __always_inline int exit_call(struct pt_regs *ctx)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct pending_call *found = pending.lookup(&tid);
    if (!found || PT_REGS_SP(ctx) != found->entry_sp + 8)
        return 0;   // not traced, or the return of a nested call
    struct pending_call call = *found;
    pending.delete(&tid);

    u64 ret = PT_REGS_RC(ctx);
    u64 now = bpf_ktime_get_ns();
    if (call.kind == K_POSIX_MEMALIGN) {
        u64 stored = 0;
        if ((int)ret == 0 && bpf_probe_read_user(&stored, sizeof(stored), (void *)call.arg) == 0 && stored)
            live_add(tgid, stored, call.size, call.stack_key, now);
        return 0;
    }
    if (call.kind == K_REALLOC && ret == 0 && call.size != 0) {
        // A failed realloc leaves the old block where it was.
        if (call.has_old)
            live_add(tgid, call.arg, call.old.size, call.old.stack_key, call.old.ts_ns);
        return 0;
    }
    if (ret)
        live_add(tgid, ret, call.size, call.stack_key, now);
    return 0;
}

static __always_inline int product_overflows(u64 a, u64 b)
{
    if (!b)
        return 0;
    u64 limit = ~0ULL / b;
    // Keeps clang from turning the test into a 128-bit multiply BPF cannot do.
    asm volatile("" : "+r"(limit));
    return a > limit;
}

int malloc_enter(struct pt_regs *ctx)
{
    return enter_call(ctx, K_ALLOC, PT_REGS_PARM1(ctx), 0);
}

int calloc_enter(struct pt_regs *ctx)
{
    u64 nmemb = PT_REGS_PARM1(ctx), size = PT_REGS_PARM2(ctx);
    if (product_overflows(nmemb, size))
        return 0;   // calloc fails without allocating
    return enter_call(ctx, K_ALLOC, nmemb * size, 0);
}

int realloc_enter(struct pt_regs *ctx)
{
    return enter_call(ctx, K_REALLOC, PT_REGS_PARM2(ctx), PT_REGS_PARM1(ctx));
}

int reallocarray_enter(struct pt_regs *ctx)
{
    u64 nmemb = PT_REGS_PARM2(ctx), size = PT_REGS_PARM3(ctx);
    if (product_overflows(nmemb, size))
        return 0;   // fails with ENOMEM, the old block stays
    return enter_call(ctx, K_REALLOC, nmemb * size, PT_REGS_PARM1(ctx));
}

int posix_memalign_enter(struct pt_regs *ctx)
{
    return enter_call(ctx, K_POSIX_MEMALIGN, PT_REGS_PARM3(ctx), PT_REGS_PARM1(ctx));
}

int aligned_alloc_enter(struct pt_regs *ctx)
{
    return enter_call(ctx, K_ALLOC, PT_REGS_PARM2(ctx), 0);
}

int valloc_enter(struct pt_regs *ctx)
{
    return enter_call(ctx, K_ALLOC, PT_REGS_PARM1(ctx), 0);
}

int pvalloc_enter(struct pt_regs *ctx)
{
    u64 size = PT_REGS_PARM1(ctx);
    return enter_call(ctx, K_ALLOC, (size + PAGE_BYTES - 1) & ~((u64)PAGE_BYTES - 1), 0);
}

int alloc_return(struct pt_regs *ctx)
{
    return exit_call(ctx);
}

int free_enter(struct pt_regs *ctx)
{
    u64 addr = PT_REGS_PARM1(ctx);
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    if (!addr || !traced(tgid))
        return 0;
    struct pending_call *outer = pending.lookup(&tid);
    if (outer && PT_REGS_SP(ctx) <= outer->entry_sp) {
        count(C_NESTED);   // e.g. realloc(p, 0) freeing p: handled at realloc
        return 0;
    }
    struct live_val gone;
    if (live_remove(tgid, addr, &gone))
        return 0;
    // A caller inside the allocator's own code is the allocator returning a
    // block it held (glibc frees its per-thread cache at thread exit).
    u64 caller = 0, here = PT_REGS_IP(ctx);
    bpf_probe_read_user(&caller, sizeof(caller), (void *)PT_REGS_SP(ctx));
    if (caller + TEXT_BEFORE_FREE >= here && caller < here + TEXT_AFTER_FREE)
        count(C_INTERNAL_FREE);
    else
        count(C_UNKNOWN_FREE);
    return 0;
}

// -c: the command's exec arms the probes, so the launcher's own calls are not traced.
int exec_arm(struct bpf_raw_tracepoint_args *ctx)
{
    if ((bpf_get_current_pid_tgid() >> 32) == TARGET_TGID) {
        u32 slot = CTL_ARMED, one = 1;
        control.update(&slot, &one);
    }
    return 0;
}

// -c: stop the command in _exit so that its final state and maps can be read.
int exit_stop(struct pt_regs *ctx)
{
    if (traced(bpf_get_current_pid_tgid() >> 32)) {
        u32 slot = CTL_EXIT_STOP, one = 1;
        control.update(&slot, &one);
        bpf_send_signal(19 /* SIGSTOP */);
    }
    return 0;
}
