// The bottom of leaktrace's preload library, which every part includes: the options read
// (`config`, options.c), how the library takes memory for itself (own_*), and the mark of what
// programs see. The library is compiled with -fvisibility=hidden: only what is marked EXPORT
// is seen by programs. Each part has a header of its own; malloc_debug.c, on top, is the
// entry points, and no part calls one above it (tests/unit/test_layers.py).
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
#include "forward.h"  // next_malloc and the rest: the allocator musl's library takes its blocks from
#define own_malloc next_malloc
#define own_calloc next_calloc
#define own_realloc next_realloc
#define own_free next_free
// musl gives a library loaded by dlopen dynamic TLS only.
#define THREAD_LOCAL __thread
#endif

// --- the options (options.c) -------------------------------------------------

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
