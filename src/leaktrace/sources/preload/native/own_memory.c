// Memory of the library's own: pages it maps, listed in leaktrace_own_maps so that leaktrace
// (the in-process gate, --unreachable) never takes the addresses they hold for the program's,
// and blocks of the program's heap it clears as they go back.
#include "own_memory.h"

#include <sched.h>
#include <string.h>
#include <sys/mman.h>

EXPORT struct own_map leaktrace_own_maps[OWN_MAPS];
EXPORT uint32_t leaktrace_own_maps_unlisted;  // mappings made when the list was full
static uint32_t own_maps_lock;

void *map_own(size_t bytes)
{
    void *start = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (start == MAP_FAILED)
        return start;
    while (__atomic_exchange_n(&own_maps_lock, 1, __ATOMIC_ACQUIRE))
        sched_yield();
    int listed = 0;
    for (int i = 0; i < OWN_MAPS && !listed; i++)
        if (!leaktrace_own_maps[i].start) {
            leaktrace_own_maps[i] = (struct own_map){(uintptr_t)start, (uintptr_t)start + bytes};
            listed = 1;
        }
    if (!listed)
        __atomic_fetch_add(&leaktrace_own_maps_unlisted, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&own_maps_lock, 0, __ATOMIC_RELEASE);
    return start;
}

void unmap_own(void *start, size_t bytes)
{
    while (__atomic_exchange_n(&own_maps_lock, 1, __ATOMIC_ACQUIRE))
        sched_yield();
    for (int i = 0; i < OWN_MAPS; i++)
        if (leaktrace_own_maps[i].start == (uintptr_t)start)
            leaktrace_own_maps[i] = (struct own_map){0, 0};
    __atomic_store_n(&own_maps_lock, 0, __ATOMIC_RELEASE);
    munmap(start, bytes);
}

void free_own(void *block, size_t bytes)
{
    if (!block)
        return;
    memset(block, 0, bytes);
    own_free(block);
}
