// The parts of leaktrace's preload library and what they share. The library is
// compiled with -fvisibility=hidden: only what is marked EXPORT is seen by programs.
#pragma once
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#define EXPORT __attribute__((visibility("default")))

// The library's own bookkeeping never passes through its hooks. glibc names its allocator a
// second time for that; musl does not, so there it takes the next allocator's blocks.
#ifdef __GLIBC__
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);
#define own_malloc __libc_malloc
#define own_calloc __libc_calloc
#define own_realloc __libc_realloc
#define own_free __libc_free
// glibc keeps static TLS for a library loaded by dlopen (an attach): its cheapest access.
#define THREAD_LOCAL __thread __attribute__((tls_model("initial-exec")))
#else
#define own_malloc next_malloc
#define own_calloc next_calloc
#define own_realloc next_realloc
#define own_free next_free
// musl gives a library loaded by dlopen dynamic TLS only.
#define THREAD_LOCAL __thread
#endif

// --- options (options.c) ---------------------------------------------------

struct config {
    int state;                  // 0: not read yet; 1: on; 2: off (bad options or other program)
    size_t frames;              // backtrace=N or backtrace_enable_on_signal=N; 0: no stacks
    int enable_on_signal;       // SIGRTMAX-19 toggles stack capture
    int backtrace;              // stacks wanted from the start (the backtrace option)
    size_t min_size, max_size;  // sizes that get a stack
    int dump_on_exit, leak_track, backtrace_full;
    size_t front_guard, rear_guard;      // bytes of 0xaa before and 0xbb after each block
    size_t fill_on_alloc, fill_on_free;  // bytes filled with 0xeb / 0xef; 0: off
    size_t expand;                       // extra bytes allocated (expand_alloc)
    size_t free_track;                   // freed blocks held back and checked (free_track)
    size_t free_track_frames;            // stack depth taken at free
    int track_allocs;                    // pointers passed in are checked against the table
    int abort_on_error;
    char prefix[PATH_MAX];  // backtrace_dump_prefix (a longer one is refused: no file could have it)
};
extern struct config config;

// Parses LIBC_DEBUG_MALLOC_OPTIONS into config; 0 (with upstream's message on stderr) if bad.
int parse_options(const char *text);

// --- the table of live blocks (table.c) ------------------------------------

#include "record.h"  // the table's records, as leaktrace reads them (layout.py is generated from it)
#include "cfi.h"     // the unwinder, and (user_types.h) the fixed-width types layout.h is written in
#include "layout.h"  // enum counter: the BPF engine's counters, read in place

// Counted in allocations, or in live_map_full when the table has no room and no memory to grow.
// A block of site's (its frames shared) counted there too, but for inherited ones.
void table_insert(uintptr_t pointer, size_t size, uint32_t flags, struct site *site);
// 0 if not there; counted (frees, and in its site) if there.
int table_take(uintptr_t pointer, struct record *out, int short_lived);
int table_contains(uintptr_t pointer);
size_t table_frames(uintptr_t pointer, uintptr_t *frames, size_t max);
// Android's zygote bit: made by this process after it was forked from a traced one.
int record_zygote_bit(const struct record *r);
struct record *table_snapshot(size_t *count);  // sorted as malloc_debug sorts them
void free_records(struct record *list, size_t count);
int same_entry(const struct record *a, const struct record *b);
void table_before_fork(void);
void table_after_fork(int child);
void table_clear(void);                // every record and counter dropped (a new attach starts from nothing)
void count_event(enum counter which);  // leaktrace_counters[which] + 1
// Memory of the library's own that holds the program's addresses: mapped and listed in
// leaktrace_own_maps (MAP_FAILED if no mapping; unlisted when the list is full, and counted).
void *map_own(size_t bytes);
void unmap_own(void *start, size_t bytes);
// A block of the library's from the program's heap, cleared as it goes back: the program may be
// handed it next, and no address the library kept may then seem to be the program's.
void free_own(void *block, size_t bytes);
uint64_t counter_value(enum counter which);

// --- sites: totals and the peak (sites.c) ------------------------------------

struct site *site_of(size_t size, const uintptr_t *frames, size_t count);  // found or made; NULL: no memory
void site_made(struct site *site);
void site_freed(struct site *site, int short_lived);
void sites_before_fork(void);
void sites_after_fork(int child);
void sites_clear(void);
extern struct site_shard leaktrace_site_shards[SITE_SHARDS];
extern struct peak leaktrace_peak;

// --- stacks and the log on stderr (stacks.c) -----------------------------

void find_own_code(void);
size_t take_stack(uintptr_t *frames, size_t max);  // the caller's stack, this library left out
void choose_unwinder(void);                        // LEAKTRACE_UNWINDER=libgcc: libgcc's walk for every stack
unsigned long stacks_walked_by_libgcc(void);       // stacks with a frame the rules could not follow
uintptr_t *copy_frames(const uintptr_t *frames, size_t count);

// --- Python frames (python_stack.c) ------------------------------------------

#include "python_stack.h"  // find_python, python_stack, leaktrace_python_codes

int start_sampling(size_t bytes, uint64_t seed);  // --sample: every bytes on average (0: every call)
// One line per frame, as malloc_debug's backtrace_string; names NULL: looked up for this call alone.
struct frame_names;
void log_backtrace(struct frame_names *names, const uintptr_t *frames, size_t count);
void write_all(int fd, const char *text, size_t length);  // retried on EINTR and short writes
void log_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// --- names of frames for the library's reports (frame_names.c) ------------

struct frame_name {
    const char *module;    // the path /proc/self/maps gives; NULL outside every mapping
    uintptr_t rel_pc;      // the pc as an address of the module's file; the pc itself if unknown
    const char *function;  // NULL if unknown
    uintptr_t offset;      // into the function
};
struct frame_names *frame_names_open(void);  // for one report (NULL: names unknown)
void frame_name(struct frame_names *names, uintptr_t pc, struct frame_name *out);
void frame_names_close(struct frame_names *names);

// --- blocks and the allocator-side options (blocks.c) ----------------------

// forward.c: the program's own allocator, which every block handed to the program comes from.
struct allocator {
    void *(*malloc)(size_t);
    void *(*calloc)(size_t, size_t);
    void *(*realloc)(void *, size_t);
    void (*free)(void *);
    void *(*memalign)(size_t, size_t);
    size_t (*usable_size)(void *);
};
extern struct allocator next_allocator;  // its functions, valid once next_allocator_state is 2
extern int next_allocator_state;         // 0: not looked up, 1: being looked up, 2: looked up
void *next_malloc(size_t size);
void *next_calloc(size_t count, size_t size);
void *next_realloc(void *pointer, size_t size);
void *next_memalign(size_t alignment, size_t size);
void next_free(void *pointer);
size_t next_usable_size(void *pointer);   // 0 when the allocator has no malloc_usable_size
int from_bootstrap(const void *pointer);  // served while the allocator was being looked up
// Attached to a running process: the allocator is the first definition in the global scope
// (the library, loaded there by dlopen, is not in it), looked up again now.
void forward_to_global_scope(void);

void blocks_init(void);
void *block_alloc(size_t size, size_t alignment, int zeroed);  // header, guards, expand, fill
size_t block_usable_size(void *pointer);
int block_headers_on(void);  // guards: each block has the library's header before it
int block_valid(void *pointer, const char *function, int check_table);  // 0 after logging why not
void unknown_pointer(void *pointer, const char *function);              // bionic's UNKNOWN POINTER report
void block_release(void *pointer);                                      // guards checked, filled, held back or freed
void verify_all_freed(void);
void blocks_before_fork(void);
void blocks_after_fork(int child);

// --- reports (reports.c) ---------------------------------------------------

void write_dump(const char *suffix);
void write_counters(const char *suffix);      // PREFIX.PID<suffix>: the counters as one line, in enum order
void write_sites(const char *suffix);         // PREFIX.PID<suffix>: the peak and the sites, as kept (record.h)
void write_python_codes(const char *suffix);  // PREFIX.PID<suffix>: the Python code table, as kept (record.h)
void log_leaks(void);

// --- entry and exit of the library's own work (malloc_debug.c) -------------

// Allocator calls made while the library works (its own, or a signal handler's)
// are recorded once the outermost call leaves.
void library_enter(void);
void library_leave(void);

// --- attached to a running process (hooks.c, malloc_debug.c) -----------------

// The options applied now, with no signal handlers (the process's own stay); 0 if bad.
int start_attached(const char *options);
void stop_attached(void);  // calls made from now on go straight to the allocator
struct replacement {
    const char *name;
    void *function;  // this library's own entry point
};
extern const struct replacement replacements[];  // the malloc family, as hooks.c patches it in
