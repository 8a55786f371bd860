// The table of live blocks and the library's counters (table.c).
#pragma once
#include "library.h"
#include "record.h"  // the table's records, as leaktrace reads them (record.py is generated from it)
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
uint64_t counter_value(enum counter which);
