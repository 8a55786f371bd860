// leaktrace's in-kernel half: uprobes on an allocator keep the live-allocation
// table, a table of unique user stacks and per-(tgid, stack, size) counts.
// Every handler does O(1) map work (the stack walk: bounded work per frame, 8 frames a
// program run; plus one pass over the stack it just
// walked); everything else happens in user space.
//
// Compile-time parameters (set by compile.py with -D):
//   TARGET_TGID    the process -c launches (armed at its exec, stopped in its _exit)
//   FOLLOW_FORKS   1 when children are traced (-f): only then can a free concern a waiting child
//   TRACE_ALL      1 for --all: a process is traced from its first allocator call
//   TARGET_ATTACHED 1 for -p: TARGET_TGID was running before the trace
//   TERMINAL_KNOWN 1: TASK_SIGNAL and SIGNAL_TTY are given (has_terminal)
//   SELF_TGID      leaktrace itself, which --all never traces, nor the processes it starts
//   PIDNS_DEV, PIDNS_INO  --container: with --all, only the processes of this pid namespace (0: all)
//   STOP_OWNERS_SHARED, STOP_OWNERS_PIN   1 and the bpffs path of the stop_owners map every
//                  leaktrace shares; 0: a map of this program's own
//   STACK_DEPTH    frames kept per stack (the caller's return address + the rest)
//   LT_SIZE_MIN    smallest size that gets a stack (inclusive)
//   LT_SIZE_MAX    largest size that gets a stack (inclusive)
//   PAGE_BYTES     the page size, for pvalloc
//   MAX_LIVE, MAX_SITES, MAX_STACKS, MAX_PROCS   map capacities
//   UNWIND_DWARF   1: stacks follow the modules' CFI rows; 0: the frame-pointer chain only
//   MAX_ROWS       capacity of the unwind-row table (every module's rows, end to end)
//   MAX_PAGES      capacity of the row-page index (every module's pages, end to end)
//   HOLD_IMAGES    1: a program exec'd under the trace (-f, --all) is stopped at its first
//                  allocator call until its unwind tables are in (see hold_for_tables)
//   TASK_SIGNAL, SIGNAL_TTY   offsets of task_struct.signal and signal_struct.tty (from BTF)
//   and each interpreter's flags (its row's kernel_cflags: interpreter_words.h, interpreter_walks.bpf.h)
//   TASK_STORAGE   1: a thread's call record is in its task storage (Linux 5.11+); 0: in a hash of
//                  MAX_THREADS records by thread id
//   ATTACH_COOKIES 1: a probe's program reads its cookie (Linux 5.15+); 0: a stub hands it on
//   COOKIE_TARGETS the programs stubs hand cookies to (cookie_stubs.py)
//
// Traced processes are the keys of `procs`. Each process image has a `gen`
// (new at fork and exec, never reused) that is part of every live and site
// key, so an exec or a reused pid starts clean and user space can drop the old
// image's entries at leisure.
//
// Fork: the child inherits its parent's live blocks (Android's zygote bit).
// BPF cannot copy a table, so until user space has copied the parent's entries
// (`inherits` says which children wait), the child looks a missing block up in
// its parent as of the fork, and a parent freeing a pre-fork block first hands
// a copy to each waiting child. Inherited blocks are not in `sites`; user space
// counts them from `live`.
#include <uapi/linux/ptrace.h>

#include "arch.h"               // the machine's facts (platform/arch.py writes it)
#include "layout.h"             // shared with user space (layout.py is generated from it)
#include "rows.h"               // the unwinder's rows and mappings (unwind/; rows.py)
#include "interpreter_words.h"  // the room of the interpreters' frames (interpreters/)
#include "walk_state.h"         // the walk's state and its stack, handed between tail calls

#define CLONE_VM 0x00000100  // uapi/linux/sched.h, spelled out: that header slows the compile
#define CLONE_THREAD 0x00010000

// bpf_probe_read_user under another name: for every call by that name bcc looks the helper
// up in /proc/kallsyms, which took 40% of the compile here.
static long (*read_user)(void *dst, u32 size, const void *unsafe_ptr) = (void *)BPF_FUNC_probe_read_user;

// An entry run's answer in a uprobe session: skip this call's return run (other entries ignore it).
#define NO_RETURN_RUN 1

enum call_kind {
    K_ALLOC,    // malloc, calloc, aligned_alloc, memalign, valloc, pvalloc
    K_REALLOC,  // realloc, reallocarray
    K_POSIX_MEMALIGN,
};

// A child whose inherited entries user space has not copied yet.
struct inherit {
    u32 parent;
    u32 parent_gen;
    u64 fork_ts;
};

struct copy_slot_key {
    u32 parent;
    u32 slot;
};
#define COPY_SLOTS 4
#define INHERIT_DEPTH 4

// Per thread: a uprobe handler can be preempted, and another thread's handler
// on the same CPU would overwrite per-CPU scratch.
struct stack_capture {
    struct stack_val walk;  // the stack being captured
    struct stack_val last;  // the last stack this thread stored...
    u64 last_key;           // ...and its key (0: none yet)
};

// The allocator call in flight on a thread (entry_sp 0: none); nested and tail
// calls are recognised by a stack pointer at or below entry_sp, and the
// matching return by entry_sp plus the bytes the return pops.
struct pending_call {
    u64 entry_sp;
    u64 size;
    u64 arg;  // realloc: old pointer; posix_memalign: memptr
    u32 kind;
    u32 gen;              // the caller's image generation
    u32 has_old;          // realloc removed a recorded block at entry
    u32 unsampled;        // --sample: the block this call makes is not kept
    u64 sample_state;     // --sample: the thread's xorshift64* generator (0: not seeded yet)
    s64 bytes_to_sample;  // --sample: bytes to the thread's next sample point (0: none drawn yet)
    u64 return_ip;        // a uprobe session: where the call returns, which tells its return run
    u64 last_made;        // the block the thread's last call made (0: its last call was a free)
    struct live_val old;
    struct stack_capture stack;
    struct walk_state walk;
    u64 walked_addr;  // the block whose stack is being walked, with its record
    struct live_val walked_val;
    u8 stack_copy[STACK_COPY];
    u8 stack_copy_slack[INTERPRETER_COPY_SLACK];  // never read (the interpreters' walks' masks)
};

// Allocated as it fills: 1.2M preallocated records would cost ~115 MB and 0.5 s at start.
BPF_F_TABLE("hash", struct live_key, struct live_val, live, MAX_LIVE, BPF_F_NO_PREALLOC);
BPF_HASH(sites, struct site_key, struct site_val, MAX_SITES);
BPF_HASH(peaks, u64, struct peak, MAX_PROCS);  // (tgid << 32 | gen) -> its image's live bytes and peak
BPF_HASH(stacks, u64, struct stack_val, MAX_STACKS);
BPF_HASH(procs, u32, struct proc, MAX_PROCS);
BPF_TABLE("lru_hash", u32, u8, unfollowed, 1024);
#if TASK_STORAGE
// In the thread's own storage: a hash update and delete per call cost ~5x more here.
BPF_TASK_STORAGE(pending, struct pending_call);
#else
// Linux before 5.11: by thread id, made from a zeroed template (pending_blank, never written) and
// dropped at the thread's exit (thread_exit); a thread past MAX_THREADS counts pending_lost.
BPF_F_TABLE("hash", u32, struct pending_call, pending, MAX_THREADS, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(pending_blank, struct pending_call, 1);
#endif
#if !ATTACH_COOKIES
// Linux before 5.15 gives a perf event's program no cookie: each probe has a program of its own
// (cookie_stubs.py) that leaves its cookie here and tail-calls the probe's program, which reads
// it at once. The CPU runs nothing else between: uprobe programs run with preemption off and
// never nest.
BPF_PERCPU_ARRAY(stub_cookie, u64, 1);
BPF_PROG_ARRAY(cookie_targets, COOKIE_TARGETS);
#endif
BPF_HASH(inherits, u32, struct inherit, MAX_PROCS);
BPF_HASH(copy_slots, struct copy_slot_key, u32, MAX_PROCS);
BPF_PERCPU_ARRAY(counters, u64, C_COUNTERS);
BPF_ARRAY(unwind_rows, struct unwind_row, MAX_ROWS);
BPF_ARRAY(unwind_pages, u64, MAX_PAGES);  // a page's rows: [low word, high word), counted from first_row
BPF_F_TABLE("hash", u32, struct exec_maps, exec_maps, MAX_PROCS, BPF_F_NO_PREALLOC);
BPF_PROG_ARRAY(unwind_programs, 1);
#if HOLD_IMAGES
BPF_HASH(holds, u32, struct hold, MAX_PROCS);  // tgid -> the image stopped for its tables
BPF_RINGBUF_OUTPUT(hold_wakeups, 1);           // a tgid per hold: wakes user space at once
#endif
// [CTL_EXIT_STOP] = 1 once exit_stop has stopped the target in _exit;
// [CTL_NEXT_GEN] the next image generation; [CTL_FORKS] children followed so far;
// [CTL_COPIES_DONE] written by user space: forks whose copies it has made;
// [CTL_TARGET_GEN] the target's generation as in `procs` (0: not traced);
// [CTL_TEXT_BEFORE_FREE], [CTL_TEXT_AFTER_FREE] the extent of the allocator's code
// around free's probe (set at start, so that the compile need not wait for it);
// [CTL_TABLES_STOP] = 1 once the target is stopped for its unwind tables;
// [CTL_TABLES_GEN] the target image whose tables user space has loaded (NO_TABLES_STOP:
// never stop; -c stops its command at the first allocator call of each new image, so
// that no stack is walked before the modules' tables are in);
// [CTL_HOLDS_OFF] = 1 once user space takes no more holds (it is closing);
// [CTL_JUDGE_EXITS] = 1: --leak-check with -f or --all holds whole processes in _exit to judge them;
// [CTL_INTERPRETER_STOP] = 1 once interpreter_stop has stopped the target where its interpreter frees its code.
BPF_ARRAY(control, u32, CTL_SLOTS);
// Every leaktrace's stops, (tgid, stopper) -> when: pinned, shared (stop_owners.py); a map of
// this program's own where the pin cannot be opened (capabilities without root).
#if STOP_OWNERS_SHARED
BPF_TABLE_PINNED("hash", struct stop_owner, u64, stop_owners, STOP_OWNERS_MAX, STOP_OWNERS_PIN);
#else
BPF_HASH(stop_owners, struct stop_owner, u64, STOP_OWNERS_MAX);
#endif

static __always_inline void count(u32 which)
{
    u64 *value = counters.lookup(&which);
    if (value)
        *value += 1;
}

// Stops the current process (SIGSTOP, in effect before it returns to user space), named first
// as this leaktrace's in stop_owners, so that no other leaktrace continues it meanwhile.
static __always_inline void stop_current(u32 tgid)
{
    struct stop_owner owner = {.tgid = tgid, .stopper = SELF_TGID};
    u64 now = bpf_ktime_get_ns();
    if (stop_owners.update(&owner, &now) != 0)
        count(C_STOPS_UNSHARED);
    bpf_send_signal(19 /* SIGSTOP */);
}

// The image generation of a traced process, 0 when it is not traced.
static __always_inline u32 traced_gen(u32 tgid)
{
#if !TRACE_ALL && !FOLLOW_FORKS
    // Only the target's probes fire (its links are filtered by pid): an array read
    // (inlined by the verifier) instead of a hash lookup on every call.
    u32 slot = CTL_TARGET_GEN;
    u32 *gen = control.lookup(&slot);
    return gen && tgid == TARGET_TGID ? *gen : 0;
#else
    struct proc *p = procs.lookup(&tgid);
    return p && !p->ignored ? p->gen : 0;
#endif
}

// The generation a call of a process runs under (0: not traced), p its record. A child that
// lost its inheritance is counted at its first call or its exit, whichever comes first: it
// ran (and is reported) without what it inherited; one that execs first inherits nothing.
static __always_inline u32 own_gen(struct proc *p)
{
    if (!p || p->ignored)
        return 0;
    if (p->inheritance_lost) {
        p->inheritance_lost = 0;
        count(C_INHERIT_LOST);
    }
    return p->gen;
}

// The image generation the current process's calls run under, 0 when it is not traced.
static __always_inline u32 current_gen(u32 tgid)
{
#if !TRACE_ALL && !FOLLOW_FORKS
    return traced_gen(tgid);
#else
    return own_gen(procs.lookup(&tgid));
#endif
}

// A process that found the process table full: counted once (the last 1,024 remembered).
static __always_inline void count_unfollowed(u32 tgid)
{
    u8 one = 1;
    if (unfollowed.insert(&tgid, &one) == 0)
        count(C_UNFOLLOWED);
}

static __always_inline u32 next_gen(void)
{
    u32 slot = CTL_NEXT_GEN;
    u32 *next = control.lookup(&slot);
    if (!next)
        return 0;
    // Not atomic (bcc's BPF target has no fetch-and-add): generations need only
    // differ per tgid, so a rare duplicate between two pids is harmless.
    u32 gen = *next;
    *next = gen + 1;
    return gen;
}

// A new image of the current process: a new generation, the current comm and uid.
static __always_inline void start_image(struct proc *p)
{
    p->inheritance_lost = 0;  // a new program inherits nothing
    p->gen = next_gen();
    p->uid = (u32)bpf_get_current_uid_gid();
    bpf_get_current_comm(p->comm, sizeof(p->comm));
}

// --container: whether the current task is in the chosen pid namespace (always, without one).
static __always_inline int in_chosen_namespace(void)
{
#if PIDNS_INO
    struct bpf_pidns_info ns;
    return bpf_get_ns_current_pid_tgid(PIDNS_DEV, PIDNS_INO, &ns, sizeof ns) == 0;
#else
    return 1;
#endif
}

// The generation for an allocator call: with --all, a process not seen
// before is traced from this call on (user space may ignore it later).
static __always_inline u32 calling_gen(u32 tgid)
{
#if TRACE_ALL
    struct proc *p = procs.lookup(&tgid);
    if (p)
        return own_gen(p);
    if (tgid == SELF_TGID || !in_chosen_namespace())
        return 0;
    struct proc started = {};
    start_image(&started);
    // NOEXIST: a racing first call of another thread may have created it.
    if (procs.insert(&tgid, &started) != 0 && !procs.lookup(&tgid)) {
        count_unfollowed(tgid);
        return 0;
    }
    return own_gen(procs.lookup(&tgid));
#else
    return current_gen(tgid);
#endif
}

// The current thread's call record; created on first use when `create`.
static __always_inline struct pending_call *thread_call(u64 create)
{
#if TASK_STORAGE
    return pending.task_storage_get(bpf_get_current_task_btf(), 0, create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
#else
    u32 tid = bpf_get_current_pid_tgid(), zero = 0;
    struct pending_call *call = pending.lookup(&tid);
    if (call || !create)
        return call;
    struct pending_call *blank = pending_blank.lookup(&zero);
    if (!blank || pending.insert(&tid, blank) != 0)
        return 0;
    return pending.lookup(&tid);
#endif
}

// The cookie of the probe that runs this program (before Linux 5.15: its stub's, see stub_cookie).
static __always_inline u64 probe_cookie(void *ctx)
{
#if ATTACH_COOKIES
    return bpf_get_attach_cookie(ctx);
#else
    u32 zero = 0;
    u64 *cookie = stub_cookie.lookup(&zero);
    return cookie ? *cookie : 0;
#endif
}

static __always_inline int wants_stack(u64 size)
{
    return size >= LT_SIZE_MIN && size <= LT_SIZE_MAX;
}

// The live bytes and peak of a process image, created at its first block (0: peak map full).
static __always_inline struct peak *peak_of(u32 tgid, u32 gen)
{
    u64 key = (u64)tgid << 32 | gen;
    struct peak *peak = peaks.lookup(&key);
    if (!peak) {
        struct peak zero = {};
        peaks.insert(&key, &zero);  // fails on a racing insert (harmless) or a full map
        peak = peaks.lookup(&key);
        if (!peak)
            count(C_PEAK_FULL);
    }
    return peak;
}

// Adds delta blocks (1: made, -1: freed, short_lived if before the thread's next one) to a
// site, and their bytes to its process's live bytes and peak. Returns 0 when the site map is
// full and the block could not be counted.
static __always_inline int site_add(u32 tgid, u32 gen, u64 stack_key, u64 size, s64 delta, u64 short_lived)
{
    struct peak *peak = peak_of(tgid, gen);
    u64 epoch = peak ? peak->epoch : 0;
    struct site_key key = {.tgid = tgid, .gen = gen, .stack_key = stack_key, .size = size};
    struct site_val *value = sites.lookup(&key);
    if (!value) {
        struct site_val zero = {};
        sites.insert(&key, &zero);  // fails on a racing insert (harmless) or a full map
        value = sites.lookup(&key);
        if (!value) {
            count(C_SITE_FULL);
            return 0;
        }
    }
    if (value->peak_epoch != epoch) {  // its first change since the epoch began: its count then
        value->peak_live = value->live;
        value->peak_epoch = epoch;
    }
    __sync_fetch_and_add(&value->live, delta);
    if (delta > 0)
        __sync_fetch_and_add(&value->allocations, 1);
    else
        __sync_fetch_and_add(&value->frees, 1);
    if (short_lived)
        __sync_fetch_and_add(&value->short_lived, 1);
    if (!peak)
        return 1;
    __sync_fetch_and_add(&peak->live_bytes, delta * (s64)size);
    s64 live = peak->live_bytes;
    if (delta > 0 && live > 0 && (u64)live > peak->peak_bytes) {
        u64 now = bpf_ktime_get_ns();
        peak->peak_bytes = live, peak->peak_ns = now;
        if ((u64)live * 100 >= peak->epoch_bytes * (100 + PEAK_STEP_PERCENT)) {
            peak->epoch_bytes = live, peak->epoch_ns = now;
            __sync_fetch_and_add(&peak->epoch, 1);
        }
    }
    return 1;
}

static __always_inline void live_add(u32 tgid, u32 gen, u64 addr, struct live_val *val)
{
    struct live_key key = {.tgid = tgid, .gen = gen, .addr = addr};
    int err = live.insert(&key, val);  // the common case: one map operation
    if (err == -17 /* EEXIST */) {
        struct live_val *stale = live.lookup(&key);
        if (stale && !stale->tombstone) {
            // The allocator handed out an address we still hold: its free went unseen.
            if (!stale->inherited)
                site_add(tgid, gen, stale->stack_key, stale->size, -1, 0);
            count(C_MISSED_FREE);
        }
        err = live.update(&key, val);
    }
    if (err != 0) {
        count(C_LIVE_FULL);
        return;
    }
    if (!val->inherited && !site_add(tgid, gen, val->stack_key, val->size, 1, 0)) {
        live.delete(&key);  // recorded nowhere rather than half-recorded
        return;
    }
    count(C_ALLOCS);
}

// A block this process inherited and still holds, looked up in its ancestors
// as they were at each fork, while user space has not copied it yet.
static __always_inline int inherited_lookup(u32 tgid, u64 addr, struct live_val *out)
{
#if FOLLOW_FORKS  // nothing is inherited without fork following
    struct inherit *link = inherits.lookup(&tgid);
#pragma clang loop unroll(disable)
    for (int depth = 0; depth < INHERIT_DEPTH && link; depth++) {
        u32 owner = link->parent;
        u64 cutoff = link->fork_ts;
        struct live_key key = {.tgid = owner, .gen = link->parent_gen, .addr = addr};
        struct live_val *val = live.lookup(&key);
        if (val) {
            // A tombstone or a later block: the parent had freed it by the fork.
            if (val->tombstone || val->ts_ns >= cutoff)
                return 0;
            *out = *val;
            out->inherited = 1;
            return 1;
        }
        link = inherits.lookup(&owner);
    }
#endif
    return 0;
}

// Before a pre-fork block disappears, each child still waiting for its copy gets one.
static __always_inline void hand_to_waiting_children(u32 tgid, u32 gen, u64 addr, struct live_val *val)
{
#if FOLLOW_FORKS
    u32 slot = CTL_FORKS;
    u32 *forks = control.lookup(&slot);
    slot = CTL_COPIES_DONE;
    u32 *done = control.lookup(&slot);
    if (!forks || !done || *forks == *done)
        return;
#pragma clang loop unroll(disable)
    for (u32 i = 0; i < COPY_SLOTS; i++) {
        struct copy_slot_key waiting = {.parent = tgid, .slot = i};
        u32 *child = copy_slots.lookup(&waiting);
        if (!child)
            continue;
        u32 child_tgid = *child;
        struct inherit *link = inherits.lookup(&child_tgid);
        if (!link || link->parent != tgid || link->parent_gen != gen || val->ts_ns >= link->fork_ts)
            continue;
        struct live_key key = {.tgid = child_tgid, .gen = traced_gen(child_tgid), .addr = addr};
        struct live_val copy = *val;
        copy.inherited = 1;
        // Fails with EEXIST when the child has its own record of the address, which wins.
        int err = live.insert(&key, &copy);
        if (err != 0 && err != -17 /* EEXIST */)
            count(C_LIVE_FULL);
    }
#endif
}

// Removes a recorded block (short_lived: the thread's last one); returns 1 and its record in
// *out when it was there.
static __always_inline int live_remove(u32 tgid, u32 gen, u64 addr, struct live_val *out, u64 short_lived)
{
    struct live_key key = {.tgid = tgid, .gen = gen, .addr = addr};
    struct live_val *val = live.lookup(&key);
    if (val) {
        if (val->tombstone)
            return 0;
        *out = *val;
        if (live.delete(&key) != 0)
            return 0;  // a racing free of the same block took it
        if (!out->inherited)
            site_add(tgid, gen, out->stack_key, out->size, -1, short_lived);
    } else {
        if (!inherited_lookup(tgid, addr, out))
            return 0;
        // Keeps the block from coming back with the copy, which never overwrites.
        struct live_val tombstone = {.ts_ns = bpf_ktime_get_ns(), .tombstone = 1};
        if (live.update(&key, &tombstone) != 0)
            count(C_LIVE_FULL);
    }
    hand_to_waiting_children(tgid, gen, addr, out);
    count(C_FREES);
    return 1;
}

// A stack stored under key: the thread's next call from the same place needs
// neither the hash nor the map lookup.
static __always_inline u64 store_as_last_stack(struct stack_capture *capture, u64 key)
{
#pragma clang loop unroll(disable)
    for (u32 i = 0; i < STACK_WORDS; i++) {
        capture->last.ip[i] = capture->walk.ip[i];
        asm volatile("" ::: "memory");  // a loop, not a memcpy call, which BPF lacks above 1 KB
    }
    capture->last_key = key;
    return key;
}

#include "walk.bpf.h"  // the stack walk (unwind/): mapping_of, row_for, unwind_one

// Stores the stack just walked and returns its key; a stack equal to the thread's last
// one needs no hash, only a lookup that it is still stored. Frames are compared on every hit, so
// a hash collision is counted as a lost stack, never merged silently.
static __always_inline u64 store_stack(struct stack_capture *capture)
{
    struct stack_val *scratch = &capture->walk;
    int same = capture->last_key != 0;
#pragma clang loop unroll(disable)
    for (u32 i = 0; i < STACK_WORDS; i++) {
        if (scratch->ip[i] != capture->last.ip[i])
            same = 0;
    }
    // Still stored: user space sweeps the stacks no record refers to any more.
    if (same && stacks.lookup(&capture->last_key))
        return capture->last_key;
    u64 hash = 0xcbf29ce484222325ULL;
#pragma clang loop unroll(disable)
    for (u32 i = 0; i < STACK_WORDS; i++) {
        hash = (hash ^ scratch->ip[i]) * 0x100000001b3ULL;
        hash ^= hash >> 29;
    }
    if (hash < FIRST_STACK_KEY)
        hash += FIRST_STACK_KEY;

    struct stack_val *known = stacks.lookup(&hash);
    if (!known) {
        int err = stacks.insert(&hash, scratch);
        if (err == 0)
            return store_as_last_stack(capture, hash);
        known = stacks.lookup(&hash);  // a racing insert of the same hash
        if (!known) {
            count(C_STACK_FULL);
            return STACK_LOST;
        }
    }
#pragma clang loop unroll(disable)
    for (u32 i = 0; i < STACK_WORDS; i++) {
        if (known->ip[i] != scratch->ip[i]) {
            count(C_STACK_COLLISION);
            return STACK_LOST;
        }
    }
    return store_as_last_stack(capture, hash);
}

#if TERMINAL_KNOWN
// Whether the current process has a controlling terminal: a job-control shell waits for its
// jobs with WUNTRACED and would take a stop for the user's Ctrl-Z, so such a process is not held.
static __always_inline int has_terminal(void)
{
    u64 task = bpf_get_current_task(), signal = 0, tty = 0;
    if (bpf_probe_read_kernel(&signal, sizeof(signal), (void *)(task + TASK_SIGNAL)) != 0 || !signal)
        return 1;
    if (bpf_probe_read_kernel(&tty, sizeof(tty), (void *)(signal + SIGNAL_TTY)) != 0)
        return 1;
    return tty != 0;
}
#endif

#if HOLD_IMAGES
// Stops the current process for user space (state: HOLD_*), unless user space takes no more
// holds, it has a terminal, or the holds table is full. The stop is sent before the wakeup,
// so user space's SIGCONT always comes after it.
static __always_inline void hold(u32 tgid, u32 gen, u32 state)
{
    u32 slot = CTL_HOLDS_OFF;
    u32 *off = control.lookup(&slot);
    if (!off || *off || has_terminal())
        return;
    struct hold now = {.gen = gen, .state = state};
    if (holds.update(&tgid, &now) != 0)
        return;
    stop_current(tgid);
    hold_wakeups.ringbuf_output(&tgid, sizeof(tgid), 0);
}

// A program exec'd under the trace whose tables are not in yet: held before this first
// allocator call runs, once per image, until user space has loaded them and continues it
// (so that its stacks are whole from its first allocation; not held: they end at frame 0,
// stacks_truncated_no_tables).
static __always_inline void hold_for_tables(u32 tgid, u32 gen)
{
    struct exec_maps *maps = exec_maps.lookup(&tgid);
    if (maps && maps->gen == gen)
        return;
    struct proc *p = procs.lookup(&tgid);
    struct hold *held = holds.lookup(&tgid);
    if (p && p->execed && !(held && held->gen == gen))
        hold(tgid, gen, HOLD_WAITING);
}
#endif

#if SAMPLE_BYTES
// The bytes to the thread's next sample point: an exponential draw of mean SAMPLE_BYTES,
// -ln(x / 2^32) for a uniform x from the thread's generator (seeded with SAMPLE_SEED and the
// thread's id), computed in Q16 fixed point: log2 x's integer part by halving, its fraction
// by squaring the mantissa, a bit a step.
static __always_inline s64 sample_distance(struct pending_call *call)
{
    u64 state = call->sample_state;
    if (!state)
        state = ((u64)SAMPLE_SEED + (u32)bpf_get_current_pid_tgid()) * 0x9e3779b97f4a7c15ULL | 1;
    state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
    call->sample_state = state;
    u64 x = (state * 0x2545f4914f6cdd1dULL) >> 32 | 1, rest = x;  // in [1, 2^32)
    u64 whole = 0;
    if (rest >> 16)
        rest >>= 16, whole += 16;
    if (rest >> 8)
        rest >>= 8, whole += 8;
    if (rest >> 4)
        rest >>= 4, whole += 4;
    if (rest >> 2)
        rest >>= 2, whole += 2;
    if (rest >> 1)
        whole += 1;
    u64 mantissa = x << (31 - whole), fraction = 0;  // [1, 2) in Q31
#pragma clang loop unroll(disable)
    for (int bit = 0; bit < 16; bit++) {
        mantissa = mantissa * mantissa >> 31;  // [1, 4) in Q31
        u64 carry = mantissa >> 32;            // no branch: each would double the verifier's paths
        mantissa >>= carry, fraction = fraction << 1 | carry;
    }
    u64 log2_x = whole << 16 | fraction;
    u64 exponential = ((32ULL << 16) - log2_x) * 45426 >> 16;  // ln 2 = 45426 / 2^16
    return (s64)((u64)SAMPLE_BYTES * exponential >> 16) + 1;
}

// Whether the block of size bytes this call makes is sampled: the thread's countdown passed
// a sample point within it (chance 1 - exp(-size / SAMPLE_BYTES)).
static __always_inline int take_sample(struct pending_call *call, u64 size)
{
    if (!call->bytes_to_sample)
        call->bytes_to_sample = sample_distance(call);  // the thread's first call
    call->bytes_to_sample -= (s64)size;
    if (call->bytes_to_sample > 0)
        return 0;
    call->bytes_to_sample = sample_distance(call);  // memoryless: the next point, from the block's end
    return 1;
}
#endif

static __always_inline int enter_call(struct pt_regs *ctx, u32 kind, u64 size, u64 arg)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    u32 gen = calling_gen(tgid);
    if (!gen)
        return NO_RETURN_RUN;
#if HOLD_IMAGES
    if (TRACE_ALL || tgid != TARGET_TGID)
        hold_for_tables(tgid, gen);
#endif
    struct pending_call *call = thread_call(1);
    if (!call) {
        count(C_PENDING_LOST);
        return NO_RETURN_RUN;
    }
#if !TRACE_ALL
    if (tgid == TARGET_TGID) {
        u32 slot = CTL_TABLES_GEN;
        u32 *loaded = control.lookup(&slot);
        slot = CTL_TABLES_STOP;
        u32 *stopping = control.lookup(&slot);
        if (loaded && stopping && *loaded != NO_TABLES_STOP && *loaded != gen && !*stopping) {
            *stopping = 1;
            stop_current(tgid);  // takes effect before the call runs
        }
    }
#endif
    u64 sp = PT_REGS_SP(ctx);
    if (call->entry_sp) {
        // Equal sp: a tail call (glibc's reallocarray jumps to realloc).
        if (sp <= call->entry_sp) {
            count(C_NESTED);
            return NO_RETURN_RUN;
        }
        count(C_STALE_CALL);
    }
#if SAMPLE_BYTES
    u32 unsampled = !take_sample(call, size);
#if RETURN_SESSION
    // Not kept: neither a record nor a return run. realloc keeps its return run: the old block
    // it removes below comes back if the call fails, and the malloc it may make inside is nested.
    if (unsampled && kind != K_REALLOC) {
        call->entry_sp = 0;
        return NO_RETURN_RUN;
    }
#if ARCH_RETURN_POPS_ADDRESS  // the call pushed its return address: at sp
    if (read_user(&call->return_ip, sizeof(call->return_ip), (void *)sp)) {
        call->entry_sp = 0;
        count(C_PENDING_LOST);
        return NO_RETURN_RUN;
    }
#else  // in the link register
    call->return_ip = PT_REGS_RET(ctx);
#endif
#endif
    call->unsampled = unsampled;
#endif
    call->entry_sp = sp;
    call->size = size;
    call->arg = arg;
    call->kind = kind;
    call->gen = gen;
    // realloc releases the old block before it returns; forget it now so that
    // another thread can be handed the same address without a clash.
    call->has_old = 0;
    if (kind == K_REALLOC && arg) {
        call->has_old = live_remove(tgid, gen, arg, &call->old, !SAMPLE_BYTES && arg == call->last_made);
        if (!call->has_old && !SAMPLE_BYTES)  // sampled, most blocks are not kept
            count(C_UNKNOWN_FREE);
    }
    return 0;
}

static __always_inline int exit_call(struct pt_regs *ctx)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct pending_call *call = thread_call(0);
    if (!call || !call->entry_sp || PT_REGS_SP(ctx) != call->entry_sp + ARCH_RETURN_POPS_ADDRESS)
        return 0;  // not traced, or the return of a nested call
    // Read in place: only this thread, now inside this handler, uses its record.
    call->entry_sp = 0;

    u64 ret = PT_REGS_RC(ctx), addr = ret;
    struct live_val val = {.size = call->size, .ts_ns = bpf_ktime_get_ns(), .stack_key = STACK_NONE};
    int made = 1;  // a new block, not the old one a failed realloc left in place
    if (call->kind == K_POSIX_MEMALIGN) {
        addr = 0;
        if ((int)ret == 0 && read_user(&addr, sizeof(addr), (void *)call->arg) != 0)
            addr = 0;
    } else if (call->kind == K_REALLOC && ret == 0 && call->size != 0) {
        // A failed realloc leaves the old block where it was.
        addr = call->has_old ? call->arg : 0;
        val = call->old;
        made = 0;
    }
    if (!addr)
        return 0;  // a failed call takes no stack
    if (made && call->unsampled)
        return 0;  // --sample: not kept, no walk
    if (made && wants_stack(call->size)) {
        // The walk starts at the return address, where the kernel has put the instruction
        // pointer back (no user read), with the caller's sp and rbp (callee-saved).
        struct walk_state *w = &call->walk;
        w->pc = PT_REGS_IP(ctx), w->sp = PT_REGS_SP(ctx), w->bp = PT_REGS_FP(ctx);
        w->depth = 0, w->end = WALK_ON, w->tgid = tgid, w->last_map = 0;
        call->walked_addr = addr, call->walked_val = val;
        w->fp_ended = 0;
        // Cleared before the walk, so the stored stack has zeros past its last frame.
#pragma clang loop unroll(disable)
        for (u32 i = 0; i < STACK_WORDS; i++) {
            call->stack.walk.ip[i] = 0;
            asm volatile("" ::: "memory");  // a loop, not a memset call, which BPF lacks above 1 KB
        }
        unwind_programs.call(ctx, 0);
        val.stack_key = STACK_LOST;  // reached only if the unwinder could not be entered
        count(C_STACK_TRUNCATED);
        count(C_TRUNCATED_NOT_ENTERED);
    }
    // One call site here, one in unwind_frames: each inlined copy of live_add lengthens bcc's compile.
    live_add(tgid, call->gen, addr, &val);
    if (made)
        call->last_made = addr;
    return 0;
}

#include "interpreter_walks.bpf.h"  // the walks of the interpreters' frames (interpreters/)

// The stack walk, FRAMES_PER_PROGRAM frames per program run, continued by tail calls
// (a loop over every frame with its searches inside would exceed what the verifier
// follows); the last run stores the stack and records the block.
int unwind_frames(struct pt_regs *ctx)
{
    struct pending_call *call = thread_call(0);
    if (!call)
        return 0;
    struct walk_state *w = &call->walk;
    struct exec_maps *maps = exec_maps.lookup(&w->tgid);
    if (maps && maps->gen != call->gen)
        maps = 0;  // the tables of an earlier image: none yet for this one
    if (w->depth == 0) {
        w->copy_base = w->sp;
        w->copied = copy_window(call, w->sp);
    }
#pragma clang loop unroll(disable)
    for (u32 i = 0; i < FRAMES_PER_PROGRAM && w->end == WALK_ON; i++)
        unwind_one(call, maps);
    if (w->end == WALK_ON) {
        unwind_programs.call(ctx, 0);  // falls through after the kernel's 33rd tail call
        truncate_walk(w, C_TRUNCATED_WALK_BUDGET);
    }
    if (w->end == WALK_TRUNCATED) {
        count(C_STACK_TRUNCATED);
        count(w->why);
    }
    interpreter_walks(call);
    struct live_val val = call->walked_val;
    val.stack_key = store_stack(&call->stack);
    live_add(w->tgid, call->gen, call->walked_addr, &val);
    call->last_made = call->walked_addr;
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

// Argument index (0: the first) of a call, where the probe's cookie says it is. The
// verifier allows only constant offsets into ctx, so a moved argument is read as kernel
// memory at its register's offset in pt_regs.
static __always_inline u64 argument(struct pt_regs *ctx, u64 cookie, u32 index, u64 abi_value)
{
#if ARCH_MOVES_PROBES
    u32 offset;
    switch ((cookie >> (COOKIE_FUNCTION_BITS + index * COOKIE_REGISTER_BITS)) & ((1 << COOKIE_REGISTER_BITS) - 1)) {
    case AR_RAX:
        offset = offsetof(struct pt_regs, ax);
        break;
    case AR_RBX:
        offset = offsetof(struct pt_regs, bx);
        break;
    case AR_RCX:
        offset = offsetof(struct pt_regs, cx);
        break;
    case AR_RDX:
        offset = offsetof(struct pt_regs, dx);
        break;
    case AR_RSI:
        offset = offsetof(struct pt_regs, si);
        break;
    case AR_RDI:
        offset = offsetof(struct pt_regs, di);
        break;
    case AR_R8:
        offset = offsetof(struct pt_regs, r8);
        break;
    case AR_R9:
        offset = offsetof(struct pt_regs, r9);
        break;
    case AR_R10:
        offset = offsetof(struct pt_regs, r10);
        break;
    case AR_R11:
        offset = offsetof(struct pt_regs, r11);
        break;
    case AR_R12:
        offset = offsetof(struct pt_regs, r12);
        break;
    case AR_R13:
        offset = offsetof(struct pt_regs, r13);
        break;
    case AR_R14:
        offset = offsetof(struct pt_regs, r14);
        break;
    case AR_R15:
        offset = offsetof(struct pt_regs, r15);
        break;
    default:
        return abi_value;
    }
    u64 value = 0;
    bpf_probe_read_kernel(&value, sizeof(value), (void *)ctx + offset);
    return value;
#else  // every probe at its function's entry: the arguments where the ABI puts them
    return abi_value;
#endif
}

// One program for every allocating entry point; the cookie of the probe's
// link says which function it sits on (F_*, as engine.py numbers them) and
// where its arguments are.
static __always_inline int alloc_entry(struct pt_regs *ctx)
{
    u64 cookie = probe_cookie(ctx);
    u64 a = argument(ctx, cookie, 0, PT_REGS_PARM1(ctx));
    u64 b = argument(ctx, cookie, 1, PT_REGS_PARM2(ctx));
    u64 c = argument(ctx, cookie, 2, PT_REGS_PARM3(ctx));
    u64 size = a, arg = 0;
    u32 kind = K_ALLOC;
    switch (cookie & ((1 << COOKIE_FUNCTION_BITS) - 1)) {
    case F_MALLOC:
    case F_VALLOC:
        break;
    case F_CALLOC:
        if (product_overflows(a, b))
            return NO_RETURN_RUN;  // calloc fails without allocating
        size = a * b;
        break;
    case F_REALLOC:
        kind = K_REALLOC, size = b, arg = a;
        break;
    case F_REALLOCARRAY:
        if (product_overflows(b, c))
            return NO_RETURN_RUN;  // fails with ENOMEM, the old block stays
        kind = K_REALLOC, size = b * c, arg = a;
        break;
    case F_POSIX_MEMALIGN:
        kind = K_POSIX_MEMALIGN, size = c, arg = a;
        break;
    case F_ALIGNED_ALLOC:
        size = b;
        break;
    case F_PVALLOC:
        size = (a + PAGE_BYTES - 1) & ~((u64)PAGE_BYTES - 1);
        break;
    default:
        return NO_RETURN_RUN;
    }
    // One call site: each inlined copy of enter_call lengthens bcc's compile.
    return enter_call(ctx, kind, size, arg);
}

#if RETURN_SESSION
// A uprobe session (Linux 6.13+): one program runs at the entry and, unless the entry run
// returned NO_RETURN_RUN, at the return. The return run is the one of the call this thread
// has in flight, back at its return address with the stack pointer just above its own.
int alloc_session(struct pt_regs *ctx)
{
    struct pending_call *call = thread_call(0);
    if (call && call->entry_sp && PT_REGS_SP(ctx) == call->entry_sp + ARCH_RETURN_POPS_ADDRESS &&
        PT_REGS_IP(ctx) == call->return_ip)
        return exit_call(ctx);
    return alloc_entry(ctx);
}
#else
int alloc_enter(struct pt_regs *ctx)
{
    return alloc_entry(ctx);
}

int alloc_return(struct pt_regs *ctx)
{
    return exit_call(ctx);
}
#endif

int free_enter(struct pt_regs *ctx)
{
    u64 addr = argument(ctx, probe_cookie(ctx), 0, PT_REGS_PARM1(ctx));
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    u32 gen = addr ? current_gen(tgid) : 0;
    if (!gen)
        return 0;
    struct live_val gone;
    // Short-lived: the thread's next call after making the block frees it. Counted only when
    // every block is kept (sampled, most of a thread's calls are unseen).
    struct pending_call *outer = SAMPLE_BYTES ? 0 : thread_call(0);
    u64 short_lived = outer && outer->last_made == addr;
    if (outer)
        outer->last_made = 0;
    if (live_remove(tgid, gen, addr, &gone, short_lived) || SAMPLE_BYTES)
        return 0;  // sampled, most frees are of blocks not kept
    // Only a miss asks whether a call is in flight: most frees are not nested.
    if (outer && PT_REGS_SP(ctx) <= outer->entry_sp) {
        count(C_NESTED);  // e.g. realloc(p, 0) freeing p: handled at realloc
        return 0;
    }
    // A caller inside the allocator's own code is the allocator returning a
    // block it held (glibc frees its per-thread cache at thread exit).
    u64 caller = 0, here = PT_REGS_IP(ctx);
#if ARCH_RETURN_POPS_ADDRESS
    read_user(&caller, sizeof(caller), (void *)PT_REGS_SP(ctx));
#else
    caller = PT_REGS_RET(ctx);
#endif
    u32 slot = CTL_TEXT_BEFORE_FREE;
    u32 *before = control.lookup(&slot);
    slot = CTL_TEXT_AFTER_FREE;
    u32 *after = control.lookup(&slot);
    if (before && after && caller + *before >= here && caller < here + *after)
        count(C_INTERNAL_FREE);
    else
        count(C_UNKNOWN_FREE);
    return 0;
}

// exec: a traced process starts a clean image (a new generation, nothing
// inherited); for -c, the command's own exec starts the trace, so the
// launcher's calls are never seen.
int process_exec(struct bpf_raw_tracepoint_args *ctx)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct proc *known = procs.lookup(&tgid);
    if (known) {
        start_image(known);
        known->execed = known->whole = 1;
        if (known->ignored == IGNORED_UNSELECTED)
            known->ignored = 0;  // a new program: user space selects again
        inherits.delete(&tgid);
    } else if (tgid == TARGET_TGID && !TRACE_ALL) {
        struct proc started = {.whole = 1};
        start_image(&started);
        if (procs.update(&tgid, &started) != 0)
            count(C_UNFOLLOWED);
    } else if (TRACE_ALL && tgid != SELF_TGID && in_chosen_namespace()) {
        // --all: a program started now by a process it does not trace (one left out, or one
        // running before the trace): traced from its start, as if its parent had been.
        struct proc started = {.execed = 1, .whole = 1};
        start_image(&started);
        if (procs.insert(&tgid, &started) != 0 && !procs.lookup(&tgid))
            count_unfollowed(tgid);
    }
    // A call the old image never returned from (a longjmp out of a signal handler) is void.
    struct pending_call *stale = thread_call(0);
    if (stale)
        stale->entry_sp = 0;
    struct proc *now = tgid == TARGET_TGID ? procs.lookup(&tgid) : 0;
    if (now) {
        u32 slot = CTL_TARGET_GEN;
        control.update(&slot, &now->gen);
    }
    return 0;
}

#if !TASK_STORAGE
// A thread ends (sched_process_exit, each thread): its call record goes with it.
int thread_exit(struct bpf_raw_tracepoint_args *ctx)
{
    u32 tid = bpf_get_current_pid_tgid();
    pending.delete(&tid);
    return 0;
}
#endif

#if FOLLOW_FORKS  // the fork and exit tracepoints are attached only then

// Tracepoint records are read at offsets that user space takes from tracefs
// (NEWTASK_PID, NEWTASK_CLONE_FLAGS, EXIT_GROUP_DEAD; 0: no group_dead field, whose test
// then reads the task at EXIT_TASK_SIGNAL and SIGNAL_LIVE, from BTF), as their layout
// varies between kernels.
static __always_inline u64 tracepoint_field(void *record, u32 offset, u32 size)
{
    u64 value = 0;
    bpf_probe_read_kernel(&value, size, (char *)record + offset);
    return value;
}

// fork: the child is traced under a new generation and, unless it shares the
// parent's memory (vfork), waits for user space to copy what it inherited.
int task_newtask(void *record)
{
    u64 clone_flags = tracepoint_field(record, NEWTASK_CLONE_FLAGS, 8);
    if (clone_flags & CLONE_THREAD)
        return 0;
    u32 parent = bpf_get_current_pid_tgid() >> 32;
    u32 child = tracepoint_field(record, NEWTASK_PID, 4);
    struct proc started = {.parent = parent};
    start_image(&started);  // the parent's comm, which the child starts with
#if TRACE_ALL
    if (parent == SELF_TGID) {
        started.ignored = IGNORED_TRACER;
        procs.update(&child, &started);
        return 0;
    }
#endif
    u32 parent_gen = traced_gen(parent);
    if (!parent_gen) {
#if FOLLOW_FORKS && !TRACE_ALL
        // -f: a child of a process the selection left out is followed, left out as well until
        // it execs a program the selection may keep (a test a make or a shell starts).
        struct proc *left_out = procs.lookup(&parent);
        if (left_out && left_out->ignored == IGNORED_UNSELECTED) {
            started.ignored = IGNORED_UNSELECTED;
            if (procs.update(&child, &started) != 0)
                count_unfollowed(child);
        }
#endif
        return 0;
    }
    struct proc *forker = procs.lookup(&parent);
    started.whole = forker && forker->whole;
    if (procs.update(&child, &started) != 0) {
        count_unfollowed(child);
        return 0;
    }
    // The child maps what its parent maps: its stacks are walked at once, not from user space's next poll.
    struct exec_maps *parent_maps = exec_maps.lookup(&parent);
    if (parent_maps && parent_maps->gen == parent_gen && exec_maps.update(&child, parent_maps) == 0) {
        struct exec_maps *child_maps = exec_maps.lookup(&child);
        if (child_maps)
            child_maps->gen = started.gen;
    }
    if (clone_flags & CLONE_VM)
        return 0;
    u32 slot = CTL_FORKS;
    u32 *forks = control.lookup(&slot);
    if (forks)
        __sync_fetch_and_add(forks, 1);
    struct inherit link = {.parent = parent, .parent_gen = parent_gen, .fork_ts = bpf_ktime_get_ns()};
    inherits.update(&child, &link);
#pragma clang loop unroll(disable)
    for (u32 i = 0; i < COPY_SLOTS; i++) {
        struct copy_slot_key waiting = {.parent = parent, .slot = i};
        if (copy_slots.insert(&waiting, &child) == 0)
            return 0;
    }
    inherits.delete(&child);
    struct proc *lost = procs.lookup(&child);
    if (lost)
        lost->inheritance_lost = 1, lost->whole = 0;
    return 0;
}

// The last thread of a traced process is gone: user space reports it once, then drops it
// (its procs record, which says so, and its live and site records).
// Whether the exiting thread is its group's last: the tracepoint's group_dead where it has one;
// else the group's live-thread count, which do_exit has already taken this thread from.
static __always_inline int group_dead(void *record)
{
#if EXIT_GROUP_DEAD
    return tracepoint_field(record, EXIT_GROUP_DEAD, 1);
#else
    void *signal = 0;
    int live = 1;
    bpf_probe_read_kernel(&signal, sizeof(signal), (char *)bpf_get_current_task() + EXIT_TASK_SIGNAL);
    if (!signal || bpf_probe_read_kernel(&live, sizeof(live), (char *)signal + SIGNAL_LIVE))
        return 0;
    return live == 0;
#endif
}

int process_exit(void *record)
{
    if (!group_dead(record))
        return 0;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct proc *p = procs.lookup(&tgid);
    if (!p)
        return 0;
    own_gen(p);  // its report lacks what it inherited, if it lost that and never exec'd
    p->exited = 1;
    // What served its calls and its waiting children goes now (its records stay for user
    // space to report, and for the children still waiting to inherit from).
    exec_maps.delete(&tgid);
    inherits.delete(&tgid);
#pragma clang loop unroll(disable)
    for (u32 i = 0; i < COPY_SLOTS; i++) {
        struct copy_slot_key waiting = {.parent = tgid, .slot = i};
        copy_slots.delete(&waiting);
    }
    return 0;
}

#endif

// -c: ld.so calls _dl_debug_state when it changes the list of modules (at start, dlopen,
// dlclose): the command's next allocator call waits until its tables are loaded again.
int modules_changed(struct pt_regs *ctx)
{
#if !TRACE_ALL
    if (bpf_get_current_pid_tgid() >> 32 != TARGET_TGID)
        return 0;
    // The cookie: _r_debug's distance from here; its r_state is RT_CONSISTENT (0) once the
    // change is done (each dlopen also calls in with RT_ADD, before its module is mapped).
    u64 to_r_debug = probe_cookie(ctx);
    u32 state = 0;
    void *r_state = (void *)(PT_REGS_IP(ctx) + to_r_debug + 24);
    if (to_r_debug && !bpf_probe_read_user(&state, sizeof state, r_state) && state)
        return 0;
    u32 slot = CTL_TABLES_GEN;
    u32 *loaded = control.lookup(&slot);
    if (loaded && *loaded != NO_TABLES_STOP)
        *loaded = 0;
#endif
    return 0;
}

// -c: stop the command in _exit so that its final state and maps can be read. With
// --leak-check and fork following (-f, --all): stop there too any other process whose every
// block is known, for user space to judge them (a hold of its own, as hold_for_tables's; not
// on a terminal).
// Stops -c's target (SIGSTOP) where it is, with why in the control slot; user space continues it.
static __always_inline int stop_target(u32 slot)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32, one = 1;
    if (tgid != TARGET_TGID || !traced_gen(tgid))
        return 0;
    control.update(&slot, &one);
    stop_current(tgid);
    return 1;
}

// The function of the target's interpreter that frees its code objects (code_freed_by): it
// stops once, before they are freed, and user space reads those its stacks' frames name. Attached to (-p), only
// off a terminal, whose job-control shell would take the stop for the user's Ctrl-Z.
int interpreter_stop(struct pt_regs *ctx)
{
#if TARGET_ATTACHED && TERMINAL_KNOWN
    if (has_terminal())
        return 0;
#elif TARGET_ATTACHED
    return 0;
#endif
    stop_target(CTL_INTERPRETER_STOP);
    return 0;
}

int exit_stop(struct pt_regs *ctx)
{
    if (stop_target(CTL_EXIT_STOP))
        return 0;
#if HOLD_IMAGES
    u32 tgid = bpf_get_current_pid_tgid() >> 32, slot = CTL_JUDGE_EXITS;
    u32 *judge = control.lookup(&slot);
    struct proc *p = procs.lookup(&tgid);
    if (judge && *judge && p && !p->ignored && p->whole)
        hold(tgid, p->gen, HOLD_AT_EXIT);
#endif
    return 0;
}
