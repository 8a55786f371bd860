// Sites: totals and the peak (sites.c).
#pragma once
#include "library.h"
#include "record.h"
#include "cfi.h"  // user_types.h: layout.h's type names
#include "layout.h"

struct site *site_of(size_t size, const uintptr_t *frames, size_t count);  // found or made; NULL: no memory
void site_made(struct site *site);
void site_freed(struct site *site, int short_lived);
void sites_before_fork(void);
void sites_after_fork(int child);
void sites_clear(void);
extern struct site_shard leaktrace_site_shards[SITE_SHARDS];
extern struct peak leaktrace_peak;
