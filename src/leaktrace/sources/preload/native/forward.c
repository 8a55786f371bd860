// The allocator the program calls without the library: the next definition of malloc after
// this library's in the symbol search order (jemalloc, tcmalloc or mimalloc when the program
// links one, else libc's). Every block handed to the program comes from it and goes back
// to it, so that no block of one allocator reaches another's functions (jemalloc's
// malloc_usable_size given a glibc block crashed redis). Calls made while dlsym looks the
// functions up (it may allocate) are served from a small arena of the library's own, whose
// blocks are never given back. The library's own bookkeeping stays on libc's heap (own_malloc).
#define _GNU_SOURCE
#include "forward.h"
#include "stacks.h"

#include <dlfcn.h>
#include <sched.h>
#include <string.h>

#define BOOTSTRAP_BYTES (64 << 10)

struct allocator next_allocator;
int next_allocator_state;
static void *scope = RTLD_NEXT;
static _Alignas(64) unsigned char bootstrap[BOOTSTRAP_BYTES];
static size_t bootstrap_used;

#ifdef __GLIBC__
#define MEMALIGN_NAME "memalign"
static const struct allocator libc_own = {__libc_malloc, __libc_calloc,   __libc_realloc,
                                          __libc_free,   __libc_memalign, NULL};
#else
#define MEMALIGN_NAME "aligned_alloc"  // musl's memalign calls aligned_alloc by its public name: this library's
static const struct allocator libc_own;  // musl's allocator has no second name: it is always found as the next
#endif

// name's next definition, if it is in the object whose base is base (else NULL).
static void *same_object(const char *name, void *base)
{
    void *found = dlsym(scope, name);
    Dl_info info;
    return found && dladdr(found, &info) && info.dli_fbase == base ? found : NULL;
}

static void look_up(void)
{
    int expected = 0;
    if (!__atomic_compare_exchange_n(&next_allocator_state, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        while (__atomic_load_n(&next_allocator_state, __ATOMIC_ACQUIRE) != 2 && expected != 1)
            sched_yield();  // another thread is looking up; a call inside dlsym (state 1 here) uses the arena
        return;
    }
    struct allocator found = libc_own;
    void *malloc_next = dlsym(scope, "malloc");
    Dl_info info;
    if (malloc_next && dladdr(malloc_next, &info)) {
        void *base = info.dli_fbase;
        struct allocator other = {
            .malloc = (void *(*)(size_t))malloc_next,
            .calloc = (void *(*)(size_t, size_t))same_object("calloc", base),
            .realloc = (void *(*)(void *, size_t))same_object("realloc", base),
            .free = (void (*)(void *))same_object("free", base),
            .memalign = (void *(*)(size_t, size_t))same_object(MEMALIGN_NAME, base),
            .usable_size = (size_t(*)(void *))same_object("malloc_usable_size", base),
        };
        if (!other.memalign)
            other.memalign = (void *(*)(size_t, size_t))same_object("aligned_alloc", base);
        if (other.calloc && other.realloc && other.free && other.memalign)  // all of one allocator, or libc's own
            found = other;
        if (found.malloc == libc_own.malloc || !found.usable_size)
            found.usable_size = (size_t(*)(void *))same_object("malloc_usable_size", base);
    }
    next_allocator = found;
    __atomic_store_n(&next_allocator_state, 2, __ATOMIC_RELEASE);
}

static int looked_up(void)
{
    if (__atomic_load_n(&next_allocator_state, __ATOMIC_ACQUIRE) == 2)
        return 1;
    look_up();
    return __atomic_load_n(&next_allocator_state, __ATOMIC_ACQUIRE) == 2;
}

void forward_to_global_scope(void)
{
    Dl_info first, own;
    void *global = dlsym(RTLD_DEFAULT, "malloc");
    if (global && dladdr(global, &first) && dladdr((void *)forward_to_global_scope, &own) &&
        first.dli_fbase == own.dli_fbase)
        return;  // preloaded after all (the process had no options for it): the next one is right
    scope = RTLD_DEFAULT;
    __atomic_store_n(&next_allocator_state, 0, __ATOMIC_RELEASE);  // nothing calls in yet: no hook is in place
    looked_up();
}

static void *from_arena(size_t size, size_t alignment)
{
    if (alignment < 16)
        alignment = 16;
    size_t used = __atomic_load_n(&bootstrap_used, __ATOMIC_RELAXED), start;
    do {
        start = (used + alignment - 1) & ~(alignment - 1);
        if (start + size > BOOTSTRAP_BYTES || start + size < start)
            return NULL;
    } while (!__atomic_compare_exchange_n(&bootstrap_used, &used, start + size, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return bootstrap + start;  // zeroed: static storage, never handed out twice
}

int from_bootstrap(const void *pointer)
{
    return (const unsigned char *)pointer >= bootstrap && (const unsigned char *)pointer < bootstrap + BOOTSTRAP_BYTES;
}

void *next_malloc(size_t size)
{
    return looked_up() ? next_allocator.malloc(size) : from_arena(size, 0);
}

void *next_calloc(size_t count, size_t size)
{
    size_t total;
#ifdef __GLIBC__
    if (looked_up())
        return next_allocator.calloc(count, size);
    return __builtin_mul_overflow(count, size, &total) ? NULL : from_arena(total, 0);
#else
    // musl's calloc calls malloc by its public name, which is this library's: its block would be counted.
    if (__builtin_mul_overflow(count, size, &total))
        return NULL;
    void *block = next_malloc(total);
    return block && !from_bootstrap(block) ? memset(block, 0, total) : block;
#endif
}

void *next_memalign(size_t alignment, size_t size)
{
    return looked_up() ? next_allocator.memalign(alignment, size) : from_arena(size, alignment);
}

void next_free(void *pointer)
{
    if (pointer && !from_bootstrap(pointer) && looked_up())
        next_allocator.free(pointer);
}

void *next_realloc(void *pointer, size_t size)
{
    if (!from_bootstrap(pointer))
        return looked_up() ? next_allocator.realloc(pointer, size) : NULL;
    void *moved = next_malloc(size);  // out of the arena: what it held, as far as it reaches
    size_t left = (size_t)(bootstrap + BOOTSTRAP_BYTES - (unsigned char *)pointer);
    if (moved)
        memcpy(moved, pointer, size < left ? size : left);
    return moved;
}

size_t next_usable_size(void *pointer)
{
    if (!pointer || from_bootstrap(pointer) || !looked_up() || !next_allocator.usable_size)
        return 0;
    return next_allocator.usable_size(pointer);
}
