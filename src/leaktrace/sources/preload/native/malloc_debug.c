// leaktrace's in-process engine: an LD_PRELOAD library that gives glibc programs
// Android's malloc_debug (get_malloc_leak_info, free_malloc_leak_info,
// malloc_backtrace, LIBC_DEBUG_MALLOC_OPTIONS). This file holds the allocator
// entry points; options.c reads the options, table.c keeps the live blocks,
// stacks.c takes stacks, blocks.c lays blocks out and checks them (guards, fills,
// free_track), reports.c writes the leak info, heap dumps and the leak log.
//
// Every call goes to the program's own allocator (forward.c). A call made while the
// library is at work in the same thread (its unwinder, qsort, a signal handler
// that interrupted it) is served at once but recorded only when the outermost
// call leaves: no recursion into the table's locks, and no allocation lost.
#include "malloc_debug.h"
#include "blocks.h"
#include "forward.h"
#include "own_memory.h"
#include "interpreter_stacks.h"
#include "reports.h"
#include "sites.h"
#include "stacks.h"
#include "table.h"

#include "allocators.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define DUMP_SIGNAL (SIGRTMAX - 17)
#define TOGGLE_SIGNAL (SIGRTMAX - 19)
#define PENDING_SLOTS 64

// 16 bytes: the library's thread-local data must fit the static TLS that glibc keeps for a
// library loaded by dlopen (an attach), about 1.6 KB.
struct pending_call {
    void *pointer;
    size_t size : 63;
    size_t is_free : 1;
};
_Static_assert(sizeof(struct pending_call) == 16, "a pending call in two words");

static volatile sig_atomic_t dump_requested, stacks_on;
static THREAD_LOCAL int depth;
// The re-entry guard: allocator calls made while the library works (its own, or a signal
// handler's) are recorded once the outermost call leaves.
static void library_enter(void);
static void library_leave(void);
// The block the thread's last allocator call made (0: it was a free): freed by its next call,
// it is short-lived. Followed only when every block is kept. Kept inverted: a reachability
// check scans this thread's memory, where the pointer itself would keep a lost block reachable.
static THREAD_LOCAL uintptr_t last_made_inverted;

// --- sampling (leaktrace --sample BYTES) -------------------------------------
// Poisson sampling over bytes, per thread: each thread counts down the bytes to its next
// sample point, drawn from an exponential distribution of mean sample_bytes, so a block of
// size s is sampled with probability 1 - exp(-s / sample_bytes), whatever came before it.
// An unsampled allocation costs the countdown and a branch. A free of an unsampled block
// is told apart by a counting filter (a byte per hash of the block's page, raised for each
// sampled block and lowered at its free) read without a lock on the common path: 64 KiB,
// so it stays in cache, and by page, so neighbouring frees read one line. A byte that is
// not zero sends the free through the table (a false positive is passed on there).
#define FILTER_BYTES (1 << 16)
static size_t sample_bytes;     // 0: every call recorded
static uint64_t sample_seed;    // each thread's generator: this, then its ordinal
static uint8_t *sample_filter;  // FILTER_BYTES counters, mmapped when sampling starts
static unsigned threads_seeded;
static THREAD_LOCAL int64_t bytes_to_sample;
static THREAD_LOCAL uint64_t sample_state;

// -ln(u) for u in (0, 1]: u = m * 2^e with m in [0.5, 1), ln m from its odd series in
// (m - 1) / (m + 1) (five terms: a relative error under 1e-5 there); no libm.
static double minus_log(double u)
{
    union {
        double d;
        uint64_t bits;
    } v = {.d = u};
    int exponent = (int)((v.bits >> 52) & 0x7ff) - 1022;
    v.bits = (v.bits & ~(0x7ffULL << 52)) | (1022ULL << 52);
    double t = (v.d - 1) / (v.d + 1), t2 = t * t;
    double log_m = 2 * t * (1 + t2 * (1.0 / 3 + t2 * (1.0 / 5 + t2 * (1.0 / 7 + t2 / 9))));
    return -(log_m + exponent * 0.6931471805599453);
}

// The bytes to the thread's next sample point (xorshift64* gives u).
static int64_t next_sample_distance(void)
{
    if (!sample_state)
        sample_state =
            (sample_seed + __atomic_add_fetch(&threads_seeded, 1, __ATOMIC_RELAXED)) * 0x9e3779b97f4a7c15u | 1;
    sample_state ^= sample_state >> 12, sample_state ^= sample_state << 25, sample_state ^= sample_state >> 27;
    double u = (double)((sample_state * 0x2545f4914f6cdd1du) >> 11) / 9007199254740992.0;  // [0, 1)
    return (int64_t)(minus_log(1 - u) * (double)sample_bytes) + 1;
}

// Whether this allocation of size bytes is sampled (always, when not sampling).
static inline int take_sample(size_t size)
{
    if (!sample_bytes)
        return 1;
    if (!bytes_to_sample)
        bytes_to_sample = next_sample_distance();  // the thread's first call
    bytes_to_sample -= (int64_t)size;
    if (bytes_to_sample > 0)
        return 0;
    bytes_to_sample = next_sample_distance();
    return 1;
}

static uint8_t *filter_byte(const void *pointer)
{
    return &sample_filter[((uintptr_t)pointer >> 12) * 0x9e3779b97f4a7c15u >> 48 & (FILTER_BYTES - 1)];
}

// Whether a pointer the table lacks is reported (bionic's UNKNOWN POINTER): only when every
// block is kept. Sampled, it is a block not kept (a filter false positive), the allocator's.
static int unknown_pointers_reported(void)
{
    return config.track_allocs && !sample_bytes;
}

// Whether pointer may be a sampled block (never wrong when it says no).
static inline int maybe_sampled(const void *pointer)
{
    return !sample_bytes || __atomic_load_n(filter_byte(pointer), __ATOMIC_RELAXED);
}

// A kept block's address into the filter (nothing when not sampling).
static void filter_add(const void *pointer)
{
    if (!sample_bytes || !pointer)
        return;
    uint8_t *at = filter_byte(pointer), seen = __atomic_load_n(at, __ATOMIC_RELAXED);
    while (seen != 255 && !__atomic_compare_exchange_n(at, &seen, seen + 1, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
        ;  // a full counter stays full: its addresses go through the table for good
}

static void filter_remove(const void *pointer)
{
    if (!sample_bytes)
        return;
    uint8_t *at = filter_byte(pointer), seen = __atomic_load_n(at, __ATOMIC_RELAXED);
    while (seen && seen != 255 &&
           !__atomic_compare_exchange_n(at, &seen, seen - 1, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
        ;
}

// Sampling from here on, every sample_bytes bytes on average (0: every call), its generator
// seeded with seed; 0 when the filter cannot be mapped (nothing changes then).
int start_sampling(size_t bytes, uint64_t seed)
{
    if (bytes && !sample_filter) {
        void *filter = mmap(NULL, FILTER_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (filter == MAP_FAILED)
            return 0;
        sample_filter = filter;
    }
    sample_seed = seed;
    __atomic_store_n(&sample_bytes, bytes, __ATOMIC_RELEASE);
    return 1;
}

// --- the hold at exit (leaktrace --engine preload --leak-check) ----------------------------
// LEAKTRACE_EXIT_HOLD="NOTIFY,RELEASE,WAITER": the process WAITER launched says at its exit
// (a byte on pipe NOTIFY) that it waits on pipe RELEASE while WAITER judges its heap; a close
// of RELEASE's other end (the judgement done, or WAITER gone) lets it exit. Each fd must still
// be the pipe it was at the start (a program may close and reuse it): else no hold, and the
// gate, having judged nothing, fails the run.
struct held_pipe {
    int fd;
    dev_t device;
    ino_t inode;
};
static struct held_pipe exit_notify = {-1, 0, 0}, exit_release = {-1, 0, 0};
static pid_t exit_waiter;

static int still_the_pipe(const struct held_pipe *pipe_end)
{
    struct stat now;
    return pipe_end->fd >= 0 && fstat(pipe_end->fd, &now) == 0 && S_ISFIFO(now.st_mode) &&
           now.st_dev == pipe_end->device && now.st_ino == pipe_end->inode;
}

static void take_pipe(struct held_pipe *pipe_end, int fd)
{
    struct stat found;
    if (fd >= 0 && fstat(fd, &found) == 0 && S_ISFIFO(found.st_mode))
        *pipe_end = (struct held_pipe){fd, found.st_dev, found.st_ino};
}

static void exit_hold_from_environment(void)
{
    const char *hold = getenv("LEAKTRACE_EXIT_HOLD");
    int notify, release, waiter;
    if (!hold || sscanf(hold, "%d,%d,%d", &notify, &release, &waiter) != 3 || waiter <= 0)
        return;
    take_pipe(&exit_notify, notify);
    take_pipe(&exit_release, release);
    exit_waiter = waiter;
}

// At exit, before the library's own work: held while leaktrace reads the heap, if it asked.
static void hold_at_exit(void)
{
    if (!exit_waiter || getppid() != exit_waiter || !still_the_pipe(&exit_notify) || !still_the_pipe(&exit_release))
        return;  // a child of the command, or pipes no longer ours: not the process to judge
    char byte = 1;
    if (write(exit_notify.fd, &byte, 1) != 1)
        return;
    while (read(exit_release.fd, &byte, 1) < 0 && errno == EINTR)
        ;
}

// A launch: LEAKTRACE_SAMPLE_BYTES and LEAKTRACE_SAMPLE_SEED, as leaktrace sets them.
static void sampling_from_environment(void)
{
    const char *bytes = getenv("LEAKTRACE_SAMPLE_BYTES"), *seed = getenv("LEAKTRACE_SAMPLE_SEED");
    if (bytes && *bytes)
        start_sampling(strtoull(bytes, NULL, 10), seed ? strtoull(seed, NULL, 10) : 0);
}

static THREAD_LOCAL unsigned pending_count;
static THREAD_LOCAL struct pending_call pending[PENDING_SLOTS];

static void on_dump_signal(int sig)
{
    (void)sig;
    dump_requested = 1;  // written at the next allocator call, outside any lock
}

static void on_toggle_signal(int sig)
{
    (void)sig;
    stacks_on = !stacks_on;
}

// No lock of the library may be held by another thread at fork: the child could never take it.
static void before_fork(void)
{
    blocks_before_fork();
    table_before_fork();
    sites_before_fork();
}

static void after_fork(int child)
{
    sites_after_fork(child);
    table_after_fork(child);
    blocks_after_fork(child);
}

static void after_fork_in_parent(void)
{
    after_fork(0);
}
static void after_fork_in_child(void)
{
    after_fork(1);
}

// The parsed options put to work: the unwinder, the block layout, fork handling; then calls
// go through the library.
static void switch_on(void)
{
    static int forks_followed;
    find_own_code();
    choose_unwinder();
    find_interpreters();
    blocks_init();
    stacks_on = config.backtrace;
    if (!forks_followed++)  // an attach after a detach: the handlers are in already
        pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
    __atomic_store_n(&config.state, 1, __ATOMIC_RELEASE);
}

// Reads the options once, on the first allocator call (constructors of other
// libraries may allocate before ours runs).
static void read_config(void)
{
    const char *options = getenv("LIBC_DEBUG_MALLOC_OPTIONS");
    const char *program = getenv("LIBC_DEBUG_MALLOC_PROGRAM");
    if (!options || !*options || (program && *program && !strstr(program_invocation_short_name, program))) {
        config.state = 2;
        return;
    }
    if (!parse_options(options)) {
        log_line("%s: malloc debug disabled: bad LIBC_DEBUG_MALLOC_OPTIONS", program_invocation_short_name);
        memset(&config, 0, sizeof config);  // nothing of a bad string is applied
        config.state = 2;
        return;
    }
    signal(DUMP_SIGNAL, on_dump_signal);
    if (config.enable_on_signal)
        signal(TOGGLE_SIGNAL, on_toggle_signal);
    sampling_from_environment();
    exit_hold_from_environment();
    switch_on();
}

int start_attached(const char *options)
{
    memset(&config, 0, sizeof config);
    config.state = 2;
    // Blocks with guards or held back after free could not be given to the allocator after the detach.
    if (!parse_options(options) || config.front_guard || config.rear_guard || config.expand || config.free_track) {
        memset(&config, 0, sizeof config);
        config.state = 2;
        return 0;
    }
    config.track_allocs = 0;  // blocks from before the attach are the allocator's: passed through, counted
    forward_to_global_scope();
    table_clear();
    switch_on();
    return 1;
}

void stop_attached(void)
{
    __atomic_store_n(&config.state, 2, __ATOMIC_RELEASE);
}

// Nonzero when calls are to go through the library (and, first, a requested dump is written).
static int ready(void)
{
    static int claimed;
    if (depth)
        return __atomic_load_n(&config.state, __ATOMIC_ACQUIRE) == 1;
    if (!config.state) {
        if (__sync_bool_compare_and_swap(&claimed, 0, 1)) {  // one thread reads, the others wait
            depth++;
            read_config();
            depth--;
        }
        while (!__atomic_load_n(&config.state, __ATOMIC_ACQUIRE))
            ;
    }
    if (config.state != 1)
        return 0;
    if (dump_requested) {
        dump_requested = 0;
        library_enter();
        write_dump(".txt");
        library_leave();
    }
    return 1;
}

static void library_enter(void)
{
    depth++;
}

// The slot is claimed with one atomic add, as a signal handler may queue a call of its own
// between the claim and the write; its write is done before the interrupted one goes on.
static void defer(void *pointer, size_t size, int is_free)
{
    unsigned slot = __atomic_fetch_add(&pending_count, 1, __ATOMIC_RELAXED);
    if (slot < PENDING_SLOTS) {
        pending[slot] = (struct pending_call){pointer, size, is_free != 0};
    } else {
        __atomic_fetch_sub(&pending_count, 1, __ATOMIC_RELAXED);
        count_event(C_PENDING_LOST);  // a free is then left undone: its block stays valid
    }
}

// free's work: the header checked, the record taken out (its absence is an unknown pointer).
static void release(void *pointer, const char *function)
{
    struct record gone;
    if (!block_valid(pointer, function, 0))
        return;
    int short_lived = ~(uintptr_t)pointer == last_made_inverted;
    last_made_inverted = 0;
    if (table_take((uintptr_t)pointer, &gone, short_lived)) {
        filter_remove(pointer);
    } else {
        if (sample_bytes) {  // a false positive of the filter: not a block of ours
            block_release(pointer);
            return;
        }
        count_event(C_UNKNOWN_FREE);
        if (config.track_allocs) {
            unknown_pointer(pointer, function);
            return;
        }
    }
    block_release(pointer);
}

// A free: done now by an outermost call; one made while the library works waits for the
// outer call to leave, so that its address is not handed out again before it is recorded.
static void free_block(void *pointer, const char *function)
{
    if (depth > 1)
        defer(pointer, 0, 1);
    else
        release(pointer, function);
}

// A new block in the table, counted in the site of its size and frames (without one, not
// recorded: site_map_full, as in the BPF engine).
static void record_in_site(uintptr_t pointer, size_t size, uint32_t flags, const uintptr_t *frames, size_t count)
{
    struct site *site = site_of(size, frames, count);
    if (!site) {
        count_event(C_SITE_FULL);
        return;
    }
    table_insert(pointer, size, flags, site);
    if (!sample_bytes)
        last_made_inverted = ~pointer;
}

static void library_leave(void)
{
    if (depth > 1 || !pending_count) {
        depth--;
        return;
    }
    // Still at depth 1: calls made while these run are queued behind them. The queue is
    // emptied only if nothing was added since the last look (a signal handler may add).
    unsigned done = 0, seen;
    do {
        for (seen = pending_count; done < seen; done++) {
            struct pending_call call = pending[done];
            if (call.is_free)
                release(call.pointer, "free");
            else
                record_in_site((uintptr_t)call.pointer, call.size, config.frames ? RECORD_UNTRACED : 0, NULL, 0);
        }
    } while (!__sync_bool_compare_and_swap(&pending_count, seen, 0));
    depth--;  // a call queued by a handler from here on waits for this thread's next call
}

// A new block: recorded with its stack, or queued when the library is at work.
static void note_allocation(void *pointer, size_t size)
{
    if (!pointer)
        return;
    if (depth > 1) {
        defer(pointer, size, 0);
        return;
    }
    uintptr_t frames[MAX_FRAMES];
    size_t count = 0;
    uint32_t flags = 0;
    if (config.frames && !stacks_on)
        flags = RECORD_UNTRACED;
    else if (config.frames && size >= config.min_size && size <= config.max_size) {
        count = take_stack(frames, config.frames);
        count += interpreter_stack(frames + count, MAX_FRAMES - count);
    }
    record_in_site((uintptr_t)pointer, size, flags, frames, count);
}

// A new block kept: in the filter before it is anyone else's to free, then recorded.
static void record_block(void *pointer, size_t size)
{
    filter_add(pointer);
    note_allocation(pointer, size);
}

// A new block that is recorded (sampled, or every block when not sampling).
static void *allocate_recorded(size_t size, size_t alignment, int zeroed)
{
    library_enter();
    void *pointer = block_alloc(size, alignment, zeroed);
    record_block(pointer, size);
    library_leave();
    return pointer;
}

static void *allocate(size_t size, size_t alignment, int zeroed)
{
    return take_sample(size) ? allocate_recorded(size, alignment, zeroed) : block_alloc(size, alignment, zeroed);
}

// A program that never allocates still hears about bad options.
__attribute__((constructor)) static void at_start(void)
{
    ready();
}

// A program leaktrace started, which leaktrace has stopped tracing (it removed the directory
// it named in LEAKTRACE_PRELOAD_DIR): what it asked for at exit is no one's any more.
static int leaktrace_gone(void)
{
    const char *directory = getenv("LEAKTRACE_PRELOAD_DIR");
    return directory && access(directory, F_OK) != 0;
}

__attribute__((destructor)) static void at_exit(void)
{
    if (config.state != 1 || leaktrace_gone())
        return;
    hold_at_exit();
    library_enter();
    if (config.free_track)
        verify_all_freed();
    if (config.leak_track)
        log_leaks();
    if (config.dump_on_exit) {
        write_interpreter_codes();
        write_sites(".exit.sites");
        write_counters(".exit.counters");  // first: the dump's arrival says these are there
        write_dump(".exit.txt");
    }
    if (counter_value(C_PENDING_LOST))
        log_line("%s: leaktrace's library could not record %lu allocator calls made inside others",
                 program_invocation_short_name, (unsigned long)counter_value(C_PENDING_LOST));
    if (stacks_walked_by_libgcc())
        log_line("%s: leaktrace's library took %lu stacks with libgcc's unwinder (a frame its CFI rules do not follow)",
                 program_invocation_short_name, stacks_walked_by_libgcc());
    library_leave();
}

// --- the allocator entry points ------------------------------------------

// Whether an unsampled call may go straight to the allocator: sampling, switched on, and
// the allocator looked up (the fast paths below test nothing else).
static inline int straight_through(void)
{
    return __builtin_expect(sample_bytes != 0, 0) && __atomic_load_n(&config.state, __ATOMIC_RELAXED) == 1 &&
           __atomic_load_n(&next_allocator_state, __ATOMIC_ACQUIRE) == 2;
}

// Sampling's common case: an allocation of size short of the thread's next sample point (0
// before its first call, so never short of it) is counted down and goes straight on.
static inline int passed_unsampled(size_t size)
{
    if (size >= (uint64_t)bytes_to_sample || !straight_through())
        return 0;
    bytes_to_sample -= (int64_t)size;
    return 1;
}

// Whether pointer is a block the allocator alone knows (sampling, not kept, not the bootstrap
// arena's), which may be handed straight to it.
static inline int allocators_own(void *pointer)
{
    return pointer && straight_through() && !maybe_sampled(pointer) && !from_bootstrap(pointer);
}

__attribute__((noinline)) static void *malloc_slow(size_t size)
{
    if (sample_bytes && __atomic_load_n(&config.state, __ATOMIC_RELAXED) == 1) {
        if (!take_sample(size))
            return next_malloc(size);
        return ready() ? allocate_recorded(size, 0, 0) : next_malloc(size);
    }
    return ready() ? allocate(size, 0, 0) : next_malloc(size);
}

EXPORT void *malloc(size_t size)
{
    return passed_unsampled(size) ? next_allocator.malloc(size) : malloc_slow(size);
}

EXPORT void *calloc(size_t count, size_t size)
{
    size_t total;
    if (!__builtin_mul_overflow(count, size, &total) && passed_unsampled(total))
        return next_allocator.calloc(count, size);
    if (!ready())
        return next_calloc(count, size);
    if (__builtin_mul_overflow(count, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return allocate(total, 0, 1);
}

__attribute__((noinline)) static void free_slow(void *pointer)
{
    // Sampling, not a block of the table's (whatever the library's state), or !ready().
    if ((sample_bytes && !maybe_sampled(pointer)) || !ready()) {
        next_free(pointer);
        return;
    }
    library_enter();
    free_block(pointer, "free");
    library_leave();
}

EXPORT void free(void *pointer)
{
    if (allocators_own(pointer))
        next_allocator.free(pointer);
    else if (pointer)
        free_slow(pointer);
}

// Whether blocks differ from glibc's (then realloc copies, as bionic's does).
static int blocks_changed(void)
{
    return config.front_guard || config.rear_guard || config.expand || config.fill_on_alloc || config.fill_on_free ||
           config.free_track;
}

static void *realloc_slow(void *pointer, size_t size);
static size_t usable_size_slow(void *pointer);

EXPORT void *realloc(void *pointer, size_t size)
{
    // An unsampled block, whose new one is not sampled either.
    if (allocators_own(pointer) && passed_unsampled(size))
        return next_allocator.realloc(pointer, size);
    return realloc_slow(pointer, size);
}

__attribute__((noinline)) static void *realloc_slow(void *pointer, size_t size)
{
    if (!pointer)
        return malloc(size);
    if (!ready())
        return next_realloc(pointer, size);
    if (!maybe_sampled(pointer)) {  // sampling: an unsampled block, whose new one may be sampled
        void *result = next_realloc(pointer, size);
        if (result && size && take_sample(size)) {
            library_enter();
            record_block(result, size);
            library_leave();
        }
        return result;
    }
    library_enter();
    int outer = depth == 1;
    void *result = NULL;
    struct record old;
    if (!block_valid(pointer, "realloc", 0)) {
        // bionic returns NULL and leaves the pointer alone
    } else if (!size) {
        free_block(pointer, "realloc");
    } else if (outer && !blocks_changed()) {
        // Out of the table before glibc may hand the address to another thread.
        // Counted as the BPF engine counts it: a free here, and a failed realloc's block recorded again.
        int had = table_take((uintptr_t)pointer, &old, ~(uintptr_t)pointer == last_made_inverted);
        if (!had && !sample_bytes)
            count_event(C_UNKNOWN_FREE);
        if (!had && unknown_pointers_reported()) {
            unknown_pointer(pointer, "realloc");
        } else {
            if (had)
                filter_remove(pointer);
            result = next_realloc(pointer, size);
            if (had && !result) {  // failed: the block stays
                table_insert(old.pointer, old.size, old.flags, old.site);
                filter_add(pointer);
            }
            if (result && take_sample(size))
                record_block(result, size);
        }
    } else if (outer && unknown_pointers_reported() && !table_contains((uintptr_t)pointer)) {
        count_event(C_UNKNOWN_FREE);
        unknown_pointer(pointer, "realloc");
    } else if ((result = block_alloc(size, 0, 0))) {
        size_t old_size = block_usable_size(pointer);
        memcpy(result, pointer, old_size < size ? old_size : size);
        if (take_sample(size))
            record_block(result, size);
        free_block(pointer, "realloc");
    }
    library_leave();
    return result;
}

EXPORT void *reallocarray(void *pointer, size_t count, size_t size)
{
    size_t total;
    if (__builtin_mul_overflow(count, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(pointer, total);
}

EXPORT void *memalign(size_t alignment, size_t size)
{
    return ready() ? allocate(size, alignment, 0) : next_memalign(alignment, size);
}

EXPORT void *aligned_alloc(size_t alignment, size_t size)
{
    if (alignment == 0 || (alignment & (alignment - 1))) {
        errno = EINVAL;  // glibc 2.36's aligned_alloc: a power of two
        return NULL;
    }
    return memalign(alignment, size);
}

EXPORT int posix_memalign(void **out, size_t alignment, size_t size)
{
    if (alignment % sizeof(void *) || (alignment & (alignment - 1)) || !alignment)
        return EINVAL;
    void *result = memalign(alignment, size);
    if (!result)
        return ENOMEM;
    *out = result;
    return 0;
}

EXPORT void *valloc(size_t size)
{
    return memalign((size_t)sysconf(_SC_PAGESIZE), size);
}

EXPORT void *pvalloc(size_t size)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), rounded;
    if (__builtin_add_overflow(size, page - 1, &rounded)) {
        errno = ENOMEM;
        return NULL;
    }
    rounded &= ~(page - 1);
    return memalign(page, rounded ? rounded : page);  // glibc gives pvalloc(0) a page
}

EXPORT size_t malloc_usable_size(void *pointer)
{
    if (allocators_own(pointer) && next_allocator.usable_size && !block_headers_on())
        return next_allocator.usable_size(pointer);
    return usable_size_slow(pointer);
}

__attribute__((noinline)) static size_t usable_size_slow(void *pointer)
{
    if (!pointer)
        return 0;
    // Sampling: a block not kept is the allocator's alone (redis asks for every block's size).
    if (__builtin_expect(sample_bytes != 0, 0) && !maybe_sampled(pointer))
        return block_usable_size(pointer);
    if (!ready())
        return block_usable_size(pointer);
    library_enter();
    size_t usable = block_valid(pointer, "malloc_usable_size", depth == 1 && unknown_pointers_reported())
                        ? block_usable_size(pointer)
                        : 0;
    library_leave();
    return usable;
}

// The entry points an attach puts in place of the allocator's in every module's GOT (the
// library is linked -Bsymbolic-functions: these are its own, not the first definitions).
#define REPLACEMENT(name) {#name, (void *)name},
const struct replacement replacements[] = {
    ALLOCATOR_FUNCTIONS(REPLACEMENT)  // the functions allocators/ names
    {"malloc_usable_size", (void *)malloc_usable_size},
    {"dlclose", (void *)dlclose},  // the unwinder forgets the rules of unloaded code
    {NULL, NULL},
};

// --- malloc_debug's API: the leak-info buffer (its entries in malloc_debug's order and layout) ---

#define ZYGOTE_BIT (1UL << 31)

EXPORT void get_malloc_leak_info(uint8_t **info, size_t *overall_size, size_t *info_size, size_t *total_memory,
                                 size_t *backtrace_size)
{
    if (!info || !overall_size || !info_size || !total_memory || !backtrace_size) {
        log_line("get_malloc_leak_info: At least one invalid parameter.");
        return;
    }
    *info = NULL;
    *overall_size = *info_size = *total_memory = *backtrace_size = 0;
    if (config.state != 1)
        return;
    if (!config.frames) {
        log_line("get_malloc_leak_info: Allocations not being tracked, to enable set the option 'backtrace'.");
        return;
    }
    library_enter();
    size_t count;
    struct record *list = table_snapshot(&count);
    size_t depth = config.frames, width = sizeof(size_t) * 2 + sizeof(uintptr_t) * depth, entries = 0;
    uint8_t *buffer = count ? own_calloc(count, width) : NULL;
    const struct record *last = NULL;  // the record the last entry was made from
    for (size_t i = 0; buffer && i < count; i++) {
        if (list[i].size > ZYGOTE_BIT - 1 || (list[i].flags & RECORD_UNTRACED))
            continue;  // the size would run into the zygote bit; made while stacks were off
        if (last && same_entry(last, &list[i])) {
            ((size_t *)(buffer + (entries - 1) * width))[1]++;
        } else {
            size_t *entry = (size_t *)(buffer + entries++ * width);
            entry[0] = list[i].size | (record_zygote_bit(&list[i]) ? ZYGOTE_BIT : 0);
            entry[1] = 1;
            memcpy(entry + 2, list[i].frames, list[i].frame_count * sizeof(uintptr_t));
            last = &list[i];
        }
        *total_memory += list[i].size;
    }
    free_records(list, count);
    if (entries) {
        *info = buffer;
        *overall_size = entries * width;
        *info_size = width;
        *backtrace_size = depth;
    } else {
        own_free(buffer);
    }
    library_leave();
}

EXPORT void free_malloc_leak_info(uint8_t *info)
{
    own_free(info);
}

EXPORT ssize_t malloc_backtrace(void *pointer, uintptr_t *frames, size_t frame_count)
{
    return (ssize_t)table_frames((uintptr_t)pointer, frames, frame_count);
}
