// What a walk of an interpreter's frames asks of the library it runs in, and the one thing it
// includes from outside interpreters/ (beside abi/): the host counts the walk's events and gives
// it memory of its own, never the program's heap (the preload library's table.c and own_memory.c).
#ifndef LEAKTRACE_INTERPRETER_HOST_H
#define LEAKTRACE_INTERPRETER_HOST_H
#include "user_types.h"  // layout.h's type names
#include "layout.h"      // enum counter

#include <stddef.h>

void count_event(enum counter which);  // leaktrace_counters[which] + 1
void *map_own(size_t bytes);           // pages no allocator knows of (MAP_FAILED: none)
void unmap_own(void *start, size_t bytes);

// The code objects an interpreter's walk keeps, which the host writes beside its exit dump as
// PREFIX.PID<suffix> (bytes 0: none kept).
struct kept_codes {
    const void *start;
    size_t bytes;
    const char *suffix;
    const char *what;  // for the host's messages
};

#endif
