// The table of live blocks: TABLE_SHARDS parts, each open addressing keyed by the
// program's pointer behind its own mutex, the part picked by the 64 MiB the pointer is in.
// leaktrace reads them in place and from a frozen copy of the process
// (--unreachable), so they are exported.
#include "table.h"
#include "own_memory.h"
#include "sites.h"
#include "stacks.h"

#include "arch.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define LOCK_SPINS 100

_Static_assert(sizeof(struct table_shard) == 128, "record.h's layout: two shards never share a cache line");
EXPORT struct table_shard leaktrace_shards[TABLE_SHARDS] __attribute__((aligned(64)));

// The BPF engine's counters, where the library has the same events; leaktrace reads them in
// place. Allocations and frees are the shards' own, counted under their locks.
EXPORT uint64_t leaktrace_counters[C_COUNTERS];

void count_event(enum counter which)
{
    __atomic_fetch_add(&leaktrace_counters[which], 1, __ATOMIC_RELAXED);
}

// With the shard's lock held, no other thread adds to it: a plain add, read whole from outside.
static void count_under_lock(uint64_t *counter)
{
    __atomic_store_n(counter, __atomic_load_n(counter, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
}

uint64_t counter_value(enum counter which)
{
    uint64_t total = __atomic_load_n(&leaktrace_counters[which], __ATOMIC_RELAXED);
    if (which == C_ALLOCS || which == C_FREES)
        for (int i = 0; i < TABLE_SHARDS; i++)
            total += __atomic_load_n(which == C_ALLOCS ? &leaktrace_shards[i].allocations : &leaktrace_shards[i].frees,
                                     __ATOMIC_RELAXED);
    return total;
}

static uint64_t hash_of(uintptr_t pointer)
{
    return pointer * 0x9e3779b97f4a7c15ULL;
}

// A shard's lock is taken with one exchange and given back with a store (a mutex pays an
// atomic both ways, on every allocation and free); a thread that finds it held spins a
// little, then yields, as the holder may have been preempted.
static void lock_shard(struct table_shard *shard)
{
    while (__atomic_exchange_n(&shard->lock, 1, __ATOMIC_ACQUIRE))
        for (unsigned spins = 0; __atomic_load_n(&shard->lock, __ATOMIC_RELAXED); spins++) {
            if (spins < LOCK_SPINS)
                ARCH_SPIN_HINT();
            else
                sched_yield();
        }
}

static void unlock_shard(struct table_shard *shard)
{
    __atomic_store_n(&shard->lock, 0, __ATOMIC_RELEASE);
}

// The shard of a pointer, locked: picked by the 64 MiB the pointer is in, the size of a glibc
// arena's heap, so that threads on different arenas take different locks and cache lines.
static struct table_shard *lock_shard_of(uintptr_t pointer)
{
    struct table_shard *shard = &leaktrace_shards[hash_of(pointer >> 26) >> 60 & (TABLE_SHARDS - 1)];
    lock_shard(shard);
    return shard;
}

static size_t slot_of(const struct table_shard *shard, uintptr_t pointer)
{
    return (size_t)(hash_of(pointer) >> 17) & (shard->slots - 1);
}

// The slot holding pointer, or the empty slot where its probe ends; the lock is held.
static size_t find_slot(const struct table_shard *shard, uintptr_t pointer)
{
    size_t j = slot_of(shard, pointer);
    while (shard->records[j].pointer && shard->records[j].pointer != pointer)
        j = (j + 1) & (shard->slots - 1);
    return j;
}

static int grow(struct table_shard *shard)
{
    size_t slots = shard->slots ? shard->slots * 2 : 256;
    struct record *bigger = own_calloc(slots, sizeof *bigger);
    if (!bigger)
        return 0;
    struct record *old = shard->records;
    size_t old_slots = shard->slots;
    shard->records = bigger;
    shard->slots = slots;
    shard->used = shard->live;
    for (size_t i = 0; i < old_slots; i++)
        if (old[i].pointer > 1)
            shard->records[find_slot(shard, old[i].pointer)] = old[i];
    free_own(old, old_slots * sizeof *old);
    return 1;
}

// A record's site, where its blocks are counted (an inherited one is in none).
static struct site *counted_in(const struct record *r)
{
    return r->flags & RECORD_INHERITED ? NULL : r->site;
}

void table_insert(uintptr_t pointer, size_t size, uint32_t flags, struct site *site)
{
    struct table_shard *shard = lock_shard_of(pointer);
    if ((shard->used + 1) * 2 > shard->slots && !grow(shard)) {
        unlock_shard(shard);
        count_event(C_LIVE_FULL);
        return;
    }
    size_t j = find_slot(shard, pointer);
    if (shard->records[j].pointer == pointer) {
        site_freed(counted_in(&shard->records[j]), 0);  // glibc handed the address out again: its free went unseen
        count_event(C_MISSED_FREE);
    } else {
        for (j = slot_of(shard, pointer); shard->records[j].pointer > 1; j = (j + 1) & (shard->slots - 1))
            ;  // the first deleted or empty slot of the probe
        if (!shard->records[j].pointer)
            shard->used++;
        shard->live++;
    }
    uint32_t frame_count = site ? site->frame_count : 0;
    shard->records[j] = (struct record){pointer, size, flags, frame_count, frame_count ? site->frames : NULL, site};
    count_under_lock(&shard->allocations);
    site_made(site);
    unlock_shard(shard);
}

int table_take(uintptr_t pointer, struct record *out, int short_lived)
{
    int found = 0;
    struct table_shard *shard = lock_shard_of(pointer);
    if (shard->slots) {
        size_t j = find_slot(shard, pointer);
        if (shard->records[j].pointer == pointer) {
            *out = shard->records[j];
            shard->records[j].pointer = 1;
            shard->live--;
            count_under_lock(&shard->frees);
            site_freed(counted_in(out), short_lived);
            found = 1;
        }
    }
    unlock_shard(shard);
    return found;
}

int table_contains(uintptr_t pointer)
{
    struct table_shard *shard = lock_shard_of(pointer);
    int found = shard->slots && shard->records[find_slot(shard, pointer)].pointer == pointer;
    unlock_shard(shard);
    return found;
}

size_t table_frames(uintptr_t pointer, uintptr_t *frames, size_t max)
{
    size_t found = 0;
    struct table_shard *shard = lock_shard_of(pointer);
    if (shard->slots) {
        const struct record *r = &shard->records[find_slot(shard, pointer)];
        if (r->pointer == pointer) {
            found = r->frame_count < max ? r->frame_count : max;
            memcpy(frames, r->frames, found * sizeof *frames);
        }
    }
    unlock_shard(shard);
    return found;
}

// 1 in a child forked while the library ran (exec starts it at 0 again); read in place too.
EXPORT int leaktrace_forked;

int record_zygote_bit(const struct record *r)
{
    return leaktrace_forked && !(r->flags & RECORD_INHERITED);
}

static int compare_records(const void *left, const void *right)
{
    const struct record *a = left, *b = right;
    int za = record_zygote_bit(a), zb = record_zygote_bit(b);
    if (za != zb)
        return za ? 1 : -1;  // z 0 first
    if (a->size != b->size)
        return a->size > b->size ? -1 : 1;  // larger first
    if (!a->frame_count != !b->frame_count)
        return a->frame_count ? -1 : 1;  // with frames first
    if (!a->frame_count || a->frame_count == b->frame_count)
        return (a->pointer > b->pointer) - (a->pointer < b->pointer);
    return a->frame_count > b->frame_count ? -1 : 1;  // deeper first
}

int same_entry(const struct record *a, const struct record *b)
{
    return record_zygote_bit(a) == record_zygote_bit(b) && a->size == b->size && a->frame_count == b->frame_count &&
           (!a->frame_count || !memcmp(a->frames, b->frames, a->frame_count * sizeof *a->frames));
}

// Every live block, sorted as malloc_debug sorts them; frames are copied. The caller
// frees the list and each frames array with free_records. Every shard is locked at once,
// so the list is the table at one moment.
struct record *table_snapshot(size_t *count)
{
    size_t live = 0, n = 0;
    for (int s = 0; s < TABLE_SHARDS; s++) {
        lock_shard(&leaktrace_shards[s]);
        live += leaktrace_shards[s].live;
    }
    struct record *list = own_malloc((live ? live : 1) * sizeof *list);
    for (int s = 0; s < TABLE_SHARDS; s++) {
        const struct table_shard *shard = &leaktrace_shards[s];
        for (size_t i = 0; list && i < shard->slots; i++) {
            const struct record *r = &shard->records[i];
            if (r->pointer <= 1)
                continue;
            list[n] = *r;
            list[n].frames = r->frame_count ? copy_frames(r->frames, r->frame_count) : NULL;
            if (!list[n].frames)
                list[n].frame_count = 0;
            n++;
        }
    }
    for (int s = TABLE_SHARDS - 1; s >= 0; s--)
        unlock_shard(&leaktrace_shards[s]);
    if (list)
        qsort(list, n, sizeof *list, compare_records);
    *count = list ? n : 0;
    return list;
}

void free_records(struct record *list, size_t count)
{
    for (size_t i = 0; i < count; i++)
        free_own(list[i].frames, list[i].frame_count * sizeof *list[i].frames);
    free_own(list, count * sizeof *list);
}

void table_before_fork(void)
{
    for (int s = 0; s < TABLE_SHARDS; s++)
        lock_shard(&leaktrace_shards[s]);
}

// In the child, every block is one it inherited; those it makes from now on carry the zygote bit.
void table_after_fork(int child)
{
    for (int s = TABLE_SHARDS - 1; s >= 0; s--) {
        struct table_shard *shard = &leaktrace_shards[s];
        for (size_t i = 0; child && i < shard->slots; i++)
            if (shard->records[i].pointer > 1)
                shard->records[i].flags |= RECORD_INHERITED;
        unlock_shard(shard);  // taken by the forking thread, in the child the only one
    }
    if (child)
        leaktrace_forked = 1;
}

void table_clear(void)
{
    for (int i = 0; i < TABLE_SHARDS; i++) {
        struct table_shard *shard = &leaktrace_shards[i];
        lock_shard(shard);
        if (shard->slots)
            memset(shard->records, 0, shard->slots * sizeof *shard->records);
        shard->used = shard->live = shard->allocations = shard->frees = 0;
        unlock_shard(shard);
    }
    for (int i = 0; i < C_COUNTERS; i++)
        __atomic_store_n(&leaktrace_counters[i], 0, __ATOMIC_RELAXED);
    sites_clear();
}
