// The top of leaktrace's preload library: its entry points (malloc_debug.c, the malloc family
// and malloc_debug's API), as the attach's front end (hooks.c) asks for them. Below it, each
// part has a header of its own, over library.h; none calls a part above it.
#pragma once
#include "library.h"

int start_sampling(size_t bytes, uint64_t seed);  // --sample: every bytes on average (0: every call)

// --- attached to a running process (hooks.c) ---------------------------------

// The options applied now, with no signal handlers (the process's own stay); 0 if bad.
int start_attached(const char *options);
void stop_attached(void);  // calls made from now on go straight to the allocator
struct replacement {
    const char *name;
    void *function;  // this library's own entry point
};
extern const struct replacement replacements[];  // the malloc family, as hooks.c patches it in
