// The sites: one per (size, stack) the program has allocated at, with its blocks live now,
// its totals since the trace began, and its count at the peak (struct site_val, as the BPF
// engine keeps them, record.h); the records of its blocks share its frames. Sites are never removed
// (a site whose blocks are all freed still has its totals), and live in mmapped memory of
// their own, not the program's heap. leaktrace reads them in place, as it reads the table.
#include "malloc_debug.h"

#include <sched.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define ARENA_CHUNK (1 << 20)

_Static_assert(sizeof(struct site_shard) == 64, "record.h's layout: two shards never share a cache line");
EXPORT struct site_shard leaktrace_site_shards[SITE_SHARDS] __attribute__((aligned(64)));
// The live bytes of the blocks of sites and their high-water mark (layout.h's struct peak): a
// new peak starts a new epoch, so the sites' counts at the peak are those of the peak itself.
EXPORT struct peak leaktrace_peak;

static struct {
    uint32_t lock;
    char *next, *end;  // what is left of the current chunk
} arena;

static void lock_word(uint32_t *lock)
{
    while (__atomic_exchange_n(lock, 1, __ATOMIC_ACQUIRE))
        while (__atomic_load_n(lock, __ATOMIC_RELAXED))
            sched_yield();
}

static void unlock_word(uint32_t *lock)
{
    __atomic_store_n(lock, 0, __ATOMIC_RELEASE);
}

// Memory of the library's own, 16-byte aligned, never given back; NULL when none is left.
static void *arena_take(size_t bytes)
{
    bytes = (bytes + 15) & ~(size_t)15;
    lock_word(&arena.lock);
    if ((size_t)(arena.end - arena.next) < bytes) {
        size_t chunk = bytes > ARENA_CHUNK ? bytes : ARENA_CHUNK;
        void *fresh = mmap(NULL, chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (fresh == MAP_FAILED) {
            unlock_word(&arena.lock);
            return NULL;
        }
        arena.next = fresh, arena.end = (char *)fresh + chunk;
    }
    void *taken = arena.next;
    arena.next += bytes;
    unlock_word(&arena.lock);
    return taken;
}

static uint64_t site_hash(size_t size, const uintptr_t *frames, size_t count)
{
    uint64_t hash = (size + 1) * 0x9e3779b97f4a7c15ULL;
    for (size_t i = 0; i < count; i++)
        hash = (hash ^ frames[i]) * 0x100000001b3ULL;
    return hash | 1;  // 0 marks no site
}

static int grow_sites(struct site_shard *shard)
{
    size_t slots = shard->slot_count ? shard->slot_count * 2 : 64;
    struct site **bigger =
        mmap(NULL, slots * sizeof *bigger, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (bigger == MAP_FAILED)
        return 0;
    for (size_t i = 0; i < shard->slot_count; i++) {
        struct site *site = shard->slots[i];
        if (!site)
            continue;
        size_t j = site->hash & (slots - 1);
        while (bigger[j])
            j = (j + 1) & (slots - 1);
        bigger[j] = site;
    }
    if (shard->slots)
        munmap(shard->slots, shard->slot_count * sizeof *shard->slots);
    __atomic_store_n(&shard->slots, bigger, __ATOMIC_RELAXED);
    shard->slot_count = slots;
    return 1;
}

struct site *site_of(size_t size, const uintptr_t *frames, size_t count)
{
    uint64_t hash = site_hash(size, frames, count);
    struct site_shard *shard = &leaktrace_site_shards[hash >> 60 & (SITE_SHARDS - 1)];
    lock_word(&shard->lock);
    struct site *found = NULL;
    size_t j = shard->slot_count ? hash & (shard->slot_count - 1) : 0;
    for (; shard->slot_count && shard->slots[j]; j = (j + 1) & (shard->slot_count - 1)) {
        struct site *site = shard->slots[j];
        if (site->hash == hash && site->size == size && site->frame_count == count &&
            (!count || !memcmp(site->frames, frames, count * sizeof *frames))) {
            found = site;
            break;
        }
    }
    if (!found && ((shard->used + 1) * 2 <= shard->slot_count || grow_sites(shard)) &&
        (found = arena_take(sizeof *found + count * sizeof *frames))) {
        *found = (struct site){.hash = hash, .size = size, .frame_count = (uint32_t)count};
        found->frames = (uintptr_t *)(found + 1);
        if (count)
            memcpy(found->frames, frames, count * sizeof *frames);
        for (j = hash & (shard->slot_count - 1); shard->slots[j];)
            j = (j + 1) & (shard->slot_count - 1);
        shard->slots[j] = found;
        shard->used++;
    }
    unlock_word(&shard->lock);
    return found;
}

// With the site's lock held: its count as of the latest peak kept, then delta blocks added,
// and their bytes to the live bytes (a new high-water mark starts an epoch).
static void site_add(struct site *site, int64_t delta, int short_lived)
{
    lock_word(&site->lock);
    uint64_t epoch = __atomic_load_n(&leaktrace_peak.epoch, __ATOMIC_RELAXED);
    if (site->peak_epoch != epoch)
        site->peak_live = site->live, site->peak_epoch = epoch;
    site->live += delta;
    if (delta > 0)
        site->allocations++;
    else
        site->frees++;
    site->short_lived += short_lived;
    int64_t live = __atomic_add_fetch(&leaktrace_peak.live_bytes, delta * (int64_t)site->size, __ATOMIC_RELAXED);
    if (delta > 0 && live > 0 && (uint64_t)live > __atomic_load_n(&leaktrace_peak.peak_bytes, __ATOMIC_RELAXED)) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        __atomic_store_n(&leaktrace_peak.peak_bytes, (uint64_t)live, __ATOMIC_RELAXED);
        __atomic_store_n(&leaktrace_peak.peak_ns, (uint64_t)now.tv_sec * 1000000000 + (uint64_t)now.tv_nsec,
                         __ATOMIC_RELAXED);
        __atomic_store_n(&leaktrace_peak.epoch_bytes, (uint64_t)live, __ATOMIC_RELAXED);
        __atomic_add_fetch(&leaktrace_peak.epoch, 1, __ATOMIC_RELEASE);
    }
    unlock_word(&site->lock);
}

void site_made(struct site *site)
{
    if (site)
        site_add(site, 1, 0);
}

void site_freed(struct site *site, int short_lived)
{
    if (site)
        site_add(site, -1, short_lived);
}

void sites_before_fork(void)
{
    lock_word(&arena.lock);
    for (int s = 0; s < SITE_SHARDS; s++)
        lock_word(&leaktrace_site_shards[s].lock);
}

// Every site's counts from nothing; in a child (the forking thread alone), their locks too.
static void zero_counts(int child)
{
    for (int s = 0; s < SITE_SHARDS; s++) {
        struct site_shard *shard = &leaktrace_site_shards[s];
        for (size_t i = 0; i < shard->slot_count; i++) {
            struct site *site = shard->slots[i];
            if (!site)
                continue;
            if (!child)
                lock_word(&site->lock);
            site->live = site->peak_live = 0;
            site->allocations = site->frees = site->short_lived = site->peak_epoch = 0;
            unlock_word(&site->lock);
        }
    }
    memset(&leaktrace_peak, 0, sizeof leaktrace_peak);
}

// A child's sites start from nothing: its inherited blocks are not its own (as in the BPF
// engine, they are in no site's counts).
void sites_after_fork(int child)
{
    if (child)
        zero_counts(1);
    for (int s = SITE_SHARDS - 1; s >= 0; s--)
        unlock_word(&leaktrace_site_shards[s].lock);
    unlock_word(&arena.lock);
}

// Every site's counts dropped (a new attach starts from nothing, with no record left); the
// sites stay.
void sites_clear(void)
{
    sites_before_fork();
    zero_counts(0);
    sites_after_fork(0);
}
