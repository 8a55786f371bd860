// The table of live blocks: open addressing keyed by the program's pointer,
// behind one mutex. leaktrace reads it from a frozen copy of the process
// (--unreachable), so its address and size are exported.
#include "malloc_debug.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

// Slot i is leaktrace_table[i], 32 bytes as struct record lays it out. Every change is
// made under leaktrace_table_lock: a reader that stops the process finds it consistent
// when the lock's first word is zero.
EXPORT struct record *leaktrace_table;
EXPORT size_t leaktrace_table_slots;
EXPORT pthread_mutex_t leaktrace_table_lock = PTHREAD_MUTEX_INITIALIZER;
static size_t table_used, table_live;

// The BPF engine's counters, where the library has the same events; leaktrace reads them in place.
EXPORT uint64_t leaktrace_counters[C_COUNTERS];

void count_event(enum counter which)
{
    __atomic_fetch_add(&leaktrace_counters[which], 1, __ATOMIC_RELAXED);
}

// With the table's lock held, no other thread adds to allocations or frees: a plain add.
static void count_under_lock(enum counter which)
{
    __atomic_store_n(&leaktrace_counters[which], __atomic_load_n(&leaktrace_counters[which], __ATOMIC_RELAXED) + 1,
                     __ATOMIC_RELAXED);
}

uint64_t counter_value(enum counter which)
{
    return __atomic_load_n(&leaktrace_counters[which], __ATOMIC_RELAXED);
}

static size_t slot_of(uintptr_t pointer)
{
    uint64_t h = pointer * 0x9e3779b97f4a7c15ULL;
    return (size_t)(h >> 17) & (leaktrace_table_slots - 1);
}

// The slot holding pointer, or the empty slot where its probe ends; the lock is held.
static size_t find_slot(uintptr_t pointer)
{
    size_t j = slot_of(pointer);
    while (leaktrace_table[j].pointer && leaktrace_table[j].pointer != pointer)
        j = (j + 1) & (leaktrace_table_slots - 1);
    return j;
}

static int grow(void)
{
    size_t slots = leaktrace_table_slots ? leaktrace_table_slots * 2 : 4096;
    struct record *bigger = __libc_calloc(slots, sizeof *bigger);
    if (!bigger)
        return 0;
    struct record *old = leaktrace_table;
    size_t old_slots = leaktrace_table_slots;
    leaktrace_table = bigger;
    leaktrace_table_slots = slots;
    table_used = table_live;
    for (size_t i = 0; i < old_slots; i++)
        if (old[i].pointer > 1)
            leaktrace_table[find_slot(old[i].pointer)] = old[i];
    __libc_free(old);
    return 1;
}

void table_insert(uintptr_t pointer, size_t size, uint32_t flags, uintptr_t *frames, uint32_t frame_count)
{
    pthread_mutex_lock(&leaktrace_table_lock);
    if ((table_used + 1) * 2 > leaktrace_table_slots && !grow()) {
        pthread_mutex_unlock(&leaktrace_table_lock);
        __libc_free(frames);
        count_event(C_LIVE_FULL);
        return;
    }
    size_t j = find_slot(pointer);
    if (leaktrace_table[j].pointer == pointer) {
        __libc_free(leaktrace_table[j].frames);  // glibc handed the address out again: its free went unseen
        count_event(C_MISSED_FREE);
    } else {
        for (j = slot_of(pointer); leaktrace_table[j].pointer > 1; j = (j + 1) & (leaktrace_table_slots - 1))
            ;  // the first deleted or empty slot of the probe
        if (!leaktrace_table[j].pointer)
            table_used++;
        table_live++;
    }
    leaktrace_table[j] = (struct record){pointer, size, flags, frame_count, frames};
    count_under_lock(C_ALLOCS);
    pthread_mutex_unlock(&leaktrace_table_lock);
}

int table_take(uintptr_t pointer, struct record *out)
{
    int found = 0;
    pthread_mutex_lock(&leaktrace_table_lock);
    if (leaktrace_table_slots) {
        size_t j = find_slot(pointer);
        if (leaktrace_table[j].pointer == pointer) {
            *out = leaktrace_table[j];
            leaktrace_table[j].pointer = 1;
            table_live--;
            count_under_lock(C_FREES);
            found = 1;
        }
    }
    pthread_mutex_unlock(&leaktrace_table_lock);
    return found;
}

int table_contains(uintptr_t pointer)
{
    pthread_mutex_lock(&leaktrace_table_lock);
    int found = leaktrace_table_slots && leaktrace_table[find_slot(pointer)].pointer == pointer;
    pthread_mutex_unlock(&leaktrace_table_lock);
    return found;
}

size_t table_frames(uintptr_t pointer, uintptr_t *frames, size_t max)
{
    size_t found = 0;
    pthread_mutex_lock(&leaktrace_table_lock);
    if (leaktrace_table_slots) {
        const struct record *r = &leaktrace_table[find_slot(pointer)];
        if (r->pointer == pointer) {
            found = r->frame_count < max ? r->frame_count : max;
            memcpy(frames, r->frames, found * sizeof *frames);
        }
    }
    pthread_mutex_unlock(&leaktrace_table_lock);
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

// Every live block, sorted as malloc_debug sorts them; frames are copied. The
// caller frees the list and each frames array with free_records.
struct record *table_snapshot(size_t *count)
{
    pthread_mutex_lock(&leaktrace_table_lock);
    struct record *list = __libc_malloc((table_live ? table_live : 1) * sizeof *list);
    size_t n = 0;
    for (size_t i = 0; list && i < leaktrace_table_slots; i++) {
        const struct record *r = &leaktrace_table[i];
        if (r->pointer <= 1)
            continue;
        list[n] = *r;
        list[n].frames = r->frame_count ? copy_frames(r->frames, r->frame_count) : NULL;
        if (!list[n].frames)
            list[n].frame_count = 0;
        n++;
    }
    pthread_mutex_unlock(&leaktrace_table_lock);
    if (list)
        qsort(list, n, sizeof *list, compare_records);
    *count = list ? n : 0;
    return list;
}

void free_records(struct record *list, size_t count)
{
    for (size_t i = 0; i < count; i++)
        __libc_free(list[i].frames);
    __libc_free(list);
}

void table_before_fork(void)
{
    pthread_mutex_lock(&leaktrace_table_lock);
}

// In the child, every block is one it inherited; those it makes from now on carry the zygote bit.
void table_after_fork(int child)
{
    if (child) {
        leaktrace_forked = 1;
        for (size_t i = 0; i < leaktrace_table_slots; i++)
            if (leaktrace_table[i].pointer > 1)
                leaktrace_table[i].flags |= RECORD_INHERITED;
        pthread_mutex_init(&leaktrace_table_lock, NULL);
    } else {
        pthread_mutex_unlock(&leaktrace_table_lock);
    }
}
