// The sites: one per (size, stack) the program has allocated at, with its blocks live now,
// its totals since the trace began and its count at the peak, in counter slots (record.h's
// struct site_counts, the BPF engine's struct site_val); the records of its blocks share its
// frames. Sites are never removed (a site whose blocks are all freed keeps its totals) and
// live in memory the library maps itself, not the program's heap (they hold no pointer to a
// block). leaktrace reads them in place, as it reads the table, and from the exit file.
#include "sites.h"
#include "own_memory.h"
#include "table.h"

#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define ARENA_CHUNK (1 << 20)

_Static_assert(sizeof(struct site_shard) == 64, "record.h's layout: two shards never share a cache line");
_Static_assert(sizeof(struct site) == 64 && sizeof(struct site_counts) == 64, "record.h's layout: a line each");
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

// Memory of the library's own, 64-byte aligned, never given back; NULL when none is left.
static void *arena_take(size_t bytes)
{
    bytes = (bytes + 63) & ~(size_t)63;
    lock_word(&arena.lock);
    if ((size_t)(arena.end - arena.next) < bytes) {
        size_t chunk = bytes > ARENA_CHUNK ? bytes : ARENA_CHUNK;
        void *fresh = map_own(chunk);
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

// Each frame's product is independent of the others' (a chain of multiplies costs ~4 cycles a
// frame; these, one): rotated by its place, so that an order of the same frames differs.
static uint64_t site_hash(size_t size, const uintptr_t *frames, size_t count)
{
    uint64_t hash = (size + 1) * 0x9e3779b97f4a7c15ULL;
    for (size_t i = 0; i < count; i++) {
        uint64_t mixed = frames[i] * 0xff51afd7ed558ccdULL;
        hash ^= mixed << (i & 31) | mixed >> (64 - (i & 31)) % 64;
    }
    hash ^= hash >> 29;
    return hash * 0xc4ceb9fe1a85ec53ULL | 1;  // 0 marks no site
}

// The thread's sites last used, by hash: most calls come from a few sites, found here without
// the shard's lock (a site, once made, stays where it is).
#define SITE_CACHE 16
static THREAD_LOCAL struct site *site_cache[SITE_CACHE];

static int site_is(const struct site *site, uint64_t hash, size_t size, const uintptr_t *frames, size_t count)
{
    return site->hash == hash && site->size == size && site->frame_count == count &&
           (!count || !memcmp(site->frames, frames, count * sizeof *frames));
}

static int grow_sites(struct site_shard *shard)
{
    size_t slots = shard->slot_count ? shard->slot_count * 2 : 64;
    struct site **bigger = map_own(slots * sizeof *bigger);
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
        unmap_own(shard->slots, shard->slot_count * sizeof *shard->slots);
    __atomic_store_n(&shard->slots, bigger, __ATOMIC_RELAXED);
    shard->slot_count = slots;
    return 1;
}

struct site *site_of(size_t size, const uintptr_t *frames, size_t count)
{
    uint64_t hash = site_hash(size, frames, count);
    struct site **cached = &site_cache[hash >> 32 & (SITE_CACHE - 1)];
    if (*cached && site_is(*cached, hash, size, frames, count))
        return *cached;
    struct site_shard *shard = &leaktrace_site_shards[hash >> 60 & (SITE_SHARDS - 1)];
    lock_word(&shard->lock);
    struct site *found = NULL;
    size_t j = shard->slot_count ? hash & (shard->slot_count - 1) : 0;
    for (; shard->slot_count && shard->slots[j]; j = (j + 1) & (shard->slot_count - 1)) {
        if (site_is(shard->slots[j], hash, size, frames, count)) {
            found = shard->slots[j];
            break;
        }
    }
    size_t counts_bytes = SITE_SLOTS * sizeof(struct site_counts);
    if (!found && shard->used < SHARD_SITES_MOST && ((shard->used + 1) * 2 <= shard->slot_count || grow_sites(shard)) &&
        (found = arena_take(sizeof *found + counts_bytes + count * sizeof *frames))) {
        *found = (struct site){.hash = hash, .size = size, .frame_count = (uint32_t)count};
        memset(found + 1, 0, counts_bytes);  // fresh from mmap, or reused after a fork: zeros
        found->frames = (uintptr_t *)((char *)(found + 1) + counts_bytes);
        if (count)
            memcpy(found->frames, frames, count * sizeof *frames);
        for (j = hash & (shard->slot_count - 1); shard->slots[j];)
            j = (j + 1) & (shard->slot_count - 1);
        shard->slots[j] = found;
        shard->used++;
    }
    unlock_word(&shard->lock);
    if (found)
        *cached = found;
    return found;
}

static struct site_counts *slots_of(struct site *site)
{
    return (struct site_counts *)(site + 1);
}

// The live bytes: one word every thread adds to costs ~50 ns a call once two threads share
// its line. While one thread allocates, it adds every change (the peak is exact); with more,
// each thread adds its changes once they come to PEAK_SLACK bytes, either way, or at its end.
#define PEAK_SLACK (64 << 10)
static unsigned threads_counted, threads_live;
static pthread_key_t thread_end_key;
static pthread_once_t thread_end_once = PTHREAD_ONCE_INIT;
static THREAD_LOCAL unsigned thread_slot;  // its ordinal + 1
static THREAD_LOCAL int64_t unpublished;
static THREAD_LOCAL int thread_ended;

// bytes added to the live bytes; a new high-water mark starts an epoch, as of which each
// slot keeps its count at its next change.
static void publish(int64_t bytes)
{
    int64_t live = __atomic_add_fetch(&leaktrace_peak.live_bytes, bytes, __ATOMIC_RELAXED);
    if (bytes > 0 && live > 0 && (uint64_t)live > __atomic_load_n(&leaktrace_peak.peak_bytes, __ATOMIC_RELAXED)) {
        struct timespec now;  // the coarse clock (a tick's resolution) costs a third of the fine one
        clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
        unsigned running = __atomic_load_n(&threads_live, __ATOMIC_RELAXED);
        __atomic_store_n(&leaktrace_peak.peak_bytes, (uint64_t)live, __ATOMIC_RELAXED);
        __atomic_store_n(&leaktrace_peak.peak_ns, (uint64_t)now.tv_sec * 1000000000 + (uint64_t)now.tv_nsec,
                         __ATOMIC_RELAXED);
        __atomic_store_n(&leaktrace_peak.epoch_bytes, (uint64_t)live, __ATOMIC_RELAXED);
        __atomic_store_n(&leaktrace_peak.unpublished, running > 1 ? (uint64_t)running * PEAK_SLACK : 0,
                         __ATOMIC_RELAXED);
        __atomic_add_fetch(&leaktrace_peak.epoch, 1, __ATOMIC_RELEASE);
    }
}

static void at_thread_end(void *unused)
{
    (void)unused;
    thread_ended = 1;  // its calls from here on (other keys' destructors) add their bytes at once
    publish(unpublished);
    unpublished = 0;
    __atomic_sub_fetch(&threads_live, 1, __ATOMIC_RELAXED);
}

static void make_thread_end_key(void)
{
    pthread_key_create(&thread_end_key, at_thread_end);
}

// A thread's first count: its slot, and its bytes published at its end.
static void first_count(void)
{
    thread_slot = __atomic_add_fetch(&threads_counted, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&threads_live, 1, __ATOMIC_RELAXED);
    pthread_once(&thread_end_once, make_thread_end_key);
    pthread_setspecific(thread_end_key, (void *)1);  // may allocate: thread_slot is set by then
}

// The first SITE_SLOTS - 1 threads each have a slot of their own, which they mark taken with a
// plain store (an exchange costs ~5 ns); the others share the last one, under its lock.
static struct site_counts *take_slot(struct site *site)
{
    if (thread_slot < SITE_SLOTS) {
        struct site_counts *own = &slots_of(site)[thread_slot - 1];
        __atomic_store_n(&own->lock, 1, __ATOMIC_RELAXED);
        __atomic_signal_fence(__ATOMIC_SEQ_CST);  // marked before its counts change, as a stopped thread shows it
        return own;
    }
    struct site_counts *shared = &slots_of(site)[SITE_SLOTS - 1];
    lock_word(&shared->lock);
    return shared;
}

// With the thread's slot taken: its count as of the latest peak kept, then delta blocks added.
static void site_add(struct site *site, int64_t delta, int short_lived)
{
    if (!thread_slot)
        first_count();
    struct site_counts *slot = take_slot(site);
    uint64_t epoch = __atomic_load_n(&leaktrace_peak.epoch, __ATOMIC_RELAXED);
    if (slot->peak_epoch != epoch)
        slot->peak_live = slot->live, slot->peak_epoch = epoch;
    slot->live += delta;
    if (delta > 0)
        slot->allocations++;
    else
        slot->frees++;
    slot->short_lived += short_lived;
    unpublished += delta * (int64_t)site->size;
    if (unpublished >= PEAK_SLACK || unpublished <= -PEAK_SLACK || thread_ended ||
        __atomic_load_n(&threads_live, __ATOMIC_RELAXED) <= 1) {
        publish(unpublished);
        unpublished = 0;
    }
    unlock_word(&slot->lock);
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
            if (!shard->slots[i])
                continue;
            for (int k = 0; k < SITE_SLOTS; k++) {
                struct site_counts *slot = &slots_of(shard->slots[i])[k];
                if (!child)
                    lock_word(&slot->lock);
                slot->live = slot->peak_live = 0;
                slot->allocations = slot->frees = slot->short_lived = slot->peak_epoch = 0;
                unlock_word(&slot->lock);
            }
        }
    }
    memset(&leaktrace_peak, 0, sizeof leaktrace_peak);
    unpublished = 0;
    if (child)  // the forking thread alone, counted if it ever was
        threads_live = thread_slot != 0;
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
