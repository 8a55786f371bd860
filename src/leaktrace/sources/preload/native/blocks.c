// The blocks handed to the program, and malloc_debug's allocator-side options:
// guards (a header before each block), fills, expand_alloc, free_track, and
// the checks of pointers passed in. Error texts are bionic's.
#include "blocks.h"
#include "forward.h"
#include "stacks.h"
#include "table.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEBUG_TAG 0x1ee7d00dU
#define DEBUG_FREE_TAG 0x1cc7dccdU
#define MINIMUM_ALIGNMENT 16
#define FRONT_GUARD_VALUE 0xaa
#define REAR_GUARD_VALUE 0xbb
#define FILL_ALLOC_VALUE 0xeb
#define FILL_FREE_VALUE 0xef
#define LOG_DIVIDER "*** *** *** *** *** *** *** *** *** *** *** *** *** *** *** ***"

// Before each block when a guard is on: [header][front guard][block][rear guard][expand].
struct header {
    uintptr_t links_room[2];  // glibc writes up to 32 bytes of bin links into a freed chunk
    void *orig;               // what glibc returned
    size_t size;              // what the program asked for
    size_t usable_size;       // what malloc_usable_size reports
    uint32_t tag;             // DEBUG_TAG while live, DEBUG_FREE_TAG once freed: past the links
};

struct freed_block {
    void *pointer;
    size_t bytes;  // filled with FILL_FREE_VALUE
    uint32_t frame_count;
    uintptr_t *frames;  // the stack of the free
};

static size_t pointer_offset;      // header and front guard: from header to block
static struct freed_block *freed;  // free_track's FIFO, a ring of config.free_track entries
static size_t freed_head, freed_count;
static pthread_mutex_t freed_lock = PTHREAD_MUTEX_INITIALIZER;

int block_headers_on(void)
{
    return config.front_guard || config.rear_guard;
}

static struct header *header_of(const void *pointer)
{
    return (struct header *)((uintptr_t)pointer - pointer_offset);
}

void blocks_init(void)
{
    next_usable_size(NULL);  // the allocator looked up now, before any block needs it
    if (block_headers_on())
        pointer_offset =
            ((sizeof(struct header) + MINIMUM_ALIGNMENT - 1) & ~(size_t)(MINIMUM_ALIGNMENT - 1)) + config.front_guard;
}

static size_t min_size(size_t a, size_t b)
{
    return a < b ? a : b;
}

static void *with_header(size_t size, size_t real, size_t alignment)
{
    if (alignment < MINIMUM_ALIGNMENT)
        alignment = MINIMUM_ALIGNMENT;
    size_t padded;
    if (__builtin_add_overflow(real, alignment - MINIMUM_ALIGNMENT, &padded)) {
        errno = ENOMEM;
        return NULL;
    }
    char *orig = next_memalign(MINIMUM_ALIGNMENT, padded);
    if (!orig)
        return NULL;
    uintptr_t pointer = ((uintptr_t)orig + pointer_offset + alignment - 1) & ~(uintptr_t)(alignment - 1);
    struct header *header = header_of((void *)pointer);
    size_t usable = next_usable_size(orig);  // 0: the allocator does not say; what was asked for then
    *header = (struct header){
        {0, 0}, orig, size, (usable > padded ? usable : padded) - (pointer - (uintptr_t)orig), DEBUG_TAG};
    memset((char *)pointer - config.front_guard, FRONT_GUARD_VALUE, config.front_guard);
    if (config.rear_guard) {
        memset((char *)pointer + size, REAR_GUARD_VALUE, config.rear_guard);
        header->usable_size = size;  // a rear guard makes the usable size exact
    }
    return (void *)pointer;
}

void *block_alloc(size_t size, size_t alignment, int zeroed)
{
    size_t real;
    if (__builtin_add_overflow(size, pointer_offset + config.rear_guard + config.expand, &real)) {
        errno = ENOMEM;
        return NULL;
    }
    while (alignment & (alignment - 1))
        alignment += alignment & -alignment;  // up to a power of two, as glibc's memalign does
    void *pointer;
    if (block_headers_on()) {
        pointer = with_header(size, real, alignment);
        if (pointer && zeroed)
            memset(pointer, 0, size);
    } else if (alignment) {
        pointer = next_memalign(alignment, real);
        if (pointer && zeroed)
            memset(pointer, 0, size);
    } else {
        pointer = zeroed ? next_calloc(1, real) : next_malloc(real);
    }
    if (pointer && config.fill_on_alloc && !zeroed)
        memset(pointer, FILL_ALLOC_VALUE, min_size(block_usable_size(pointer), config.fill_on_alloc));
    return pointer;
}

size_t block_usable_size(void *pointer)
{
    return block_headers_on() ? header_of(pointer)->usable_size : next_usable_size(pointer);
}

static void error_end(void)
{
    log_line(LOG_DIVIDER);
    if (config.abort_on_error)
        abort();
}

static void log_stack_here(void)
{
    uintptr_t frames[MAX_FRAMES];
    log_line("Backtrace at time of failure:");
    log_backtrace(NULL, frames, take_stack(frames, config.frames ? config.frames : 16));
}

// bionic's PointerData::LogFreeBacktrace: the free that put this block in free_track.
static void log_original_free(const void *pointer)
{
    pthread_mutex_lock(&freed_lock);
    for (size_t i = 0; i < freed_count; i++) {
        const struct freed_block *f = &freed[(freed_head + i) % config.free_track];
        if (f->pointer == pointer && f->frame_count) {
            log_line("Backtrace of original free:");
            log_backtrace(NULL, f->frames, f->frame_count);
            break;
        }
    }
    pthread_mutex_unlock(&freed_lock);
}

static void pointer_error(const void *pointer, const char *what)
{
    log_line(LOG_DIVIDER);
    log_line("+++ ALLOCATION %p %s", pointer, what);
    if (config.free_track)
        log_original_free(pointer);
    log_stack_here();
    error_end();
}

int block_valid(void *pointer, const char *function, int check_table)
{
    char what[64];
    if (block_headers_on()) {
        uint32_t tag = header_of(pointer)->tag;
        if (tag != DEBUG_TAG) {
            if (tag == DEBUG_FREE_TAG)
                snprintf(what, sizeof what, "USED AFTER FREE (%s)", function);
            else
                snprintf(what, sizeof what, "HAS INVALID TAG %x (%s)", tag, function);
            pointer_error(pointer, what);
            return 0;
        }
    }
    if (check_table && config.track_allocs && !table_contains((uintptr_t)pointer)) {
        unknown_pointer(pointer, function);
        return 0;
    }
    return 1;
}

void unknown_pointer(void *pointer, const char *function)
{
    char what[64];
    snprintf(what, sizeof what, "UNKNOWN POINTER (%s)", function);
    pointer_error(pointer, what);
}

static int all_equal(const uint8_t *bytes, size_t count, uint8_t value)
{
    for (size_t i = 0; i < count; i++)
        if (bytes[i] != value)
            return 0;
    return 1;
}

// Each byte that differs, by its index from the block's start (negative in a front guard).
static void log_differences(const uint8_t *bytes, size_t count, uint8_t expected, long first_index)
{
    for (size_t i = 0; i < count; i++)
        if (bytes[i] != expected)
            log_line("  allocation[%ld] = 0x%02x (expected 0x%02x)", first_index + (long)i, bytes[i], expected);
}

// bionic's GuardData::LogFailure, for one guard.
static void check_guard(const struct header *header, const void *pointer, const uint8_t *guard, size_t bytes,
                        uint8_t expected, const char *which)
{
    if (all_equal(guard, bytes, expected))
        return;
    log_line(LOG_DIVIDER);
    log_line("+++ ALLOCATION %p SIZE %zu HAS A CORRUPTED %s GUARD", pointer, header->size, which);
    log_differences(guard, bytes, expected, (long)((uintptr_t)guard - (uintptr_t)pointer));
    log_stack_here();
    error_end();
}

// free_track's check of a block it held: still filled, header still marked freed.
static void verify_freed(const struct freed_block *f)
{
    if (block_headers_on()) {
        const struct header *header = header_of(f->pointer);
        if (header->tag != DEBUG_FREE_TAG) {
            log_line(LOG_DIVIDER);
            log_line("+++ ALLOCATION 0x%lx HAS CORRUPTED HEADER TAG 0x%x AFTER FREE", (unsigned long)f->pointer,
                     header->tag);
            error_end();
            return;
        }
    }
    size_t bytes = min_size(f->bytes, config.fill_on_free);
    if (all_equal(f->pointer, bytes, FILL_FREE_VALUE))
        return;
    log_line(LOG_DIVIDER);
    log_line("+++ ALLOCATION %p USED AFTER FREE", f->pointer);
    log_differences(f->pointer, bytes, FILL_FREE_VALUE, 0);
    if (f->frame_count) {
        log_line("Backtrace at time of free:");
        log_backtrace(NULL, f->frames, f->frame_count);
    }
    error_end();
}

// Holds a freed block back; returns the oldest one, checked, once more than free_track are held.
static void *hold_freed(void *pointer, size_t bytes)
{
    uintptr_t stack[MAX_FRAMES];
    size_t depth = config.free_track_frames ? take_stack(stack, config.free_track_frames) : 0;
    struct freed_block entry = {pointer, bytes, 0, depth ? copy_frames(stack, depth) : NULL};
    if (entry.frames)
        entry.frame_count = (uint32_t)depth;
    void *evicted = NULL;
    pthread_mutex_lock(&freed_lock);
    if (!freed && !(freed = own_calloc(config.free_track, sizeof *freed))) {
        pthread_mutex_unlock(&freed_lock);
        own_free(entry.frames);
        return pointer;  // no room to hold it: freed at once
    }
    if (freed_count == config.free_track) {
        struct freed_block *oldest = &freed[freed_head];
        verify_freed(oldest);
        evicted = oldest->pointer;
        own_free(oldest->frames);
        *oldest = entry;
        freed_head = (freed_head + 1) % config.free_track;
    } else {
        freed[(freed_head + freed_count++) % config.free_track] = entry;
    }
    pthread_mutex_unlock(&freed_lock);
    return evicted;
}

void block_release(void *pointer)
{
    if (!config.fill_on_free && !block_headers_on()) {  // the common case: the allocator's block as it is
        next_free(pointer);
        return;
    }
    size_t bytes;
    if (block_headers_on()) {
        struct header *header = header_of(pointer);
        check_guard(header, pointer, (uint8_t *)pointer - config.front_guard, config.front_guard, FRONT_GUARD_VALUE,
                    "FRONT");
        check_guard(header, pointer, (uint8_t *)pointer + header->size, config.rear_guard, REAR_GUARD_VALUE, "REAR");
        header->tag = DEBUG_FREE_TAG;
        bytes = header->usable_size;
    } else {
        bytes = next_usable_size(pointer);
    }
    if (config.fill_on_free)
        memset(pointer, FILL_FREE_VALUE, min_size(bytes, config.fill_on_free));
    if (config.free_track && !(pointer = hold_freed(pointer, bytes)))
        return;
    next_free(block_headers_on() ? header_of(pointer)->orig : pointer);
}

void verify_all_freed(void)
{
    pthread_mutex_lock(&freed_lock);
    for (size_t i = 0; i < freed_count; i++)
        verify_freed(&freed[(freed_head + i) % config.free_track]);
    pthread_mutex_unlock(&freed_lock);
}

void blocks_before_fork(void)
{
    pthread_mutex_lock(&freed_lock);
}

void blocks_after_fork(int child)
{
    if (child)
        pthread_mutex_init(&freed_lock, NULL);
    else
        pthread_mutex_unlock(&freed_lock);
}
