// The program's own allocator, which every block handed to the program comes from (forward.c).
#pragma once
#include <stddef.h>

struct allocator {
    void *(*malloc)(size_t);
    void *(*calloc)(size_t, size_t);
    void *(*realloc)(void *, size_t);
    void (*free)(void *);
    void *(*memalign)(size_t, size_t);
    size_t (*usable_size)(void *);
};
extern struct allocator next_allocator;  // its functions, valid once next_allocator_state is 2
extern int next_allocator_state;         // 0: not looked up, 1: being looked up, 2: looked up
void *next_malloc(size_t size);
void *next_calloc(size_t count, size_t size);
void *next_realloc(void *pointer, size_t size);
void *next_memalign(size_t alignment, size_t size);
void next_free(void *pointer);
size_t next_usable_size(void *pointer);   // 0 when the allocator has no malloc_usable_size
int from_bootstrap(const void *pointer);  // served while the allocator was being looked up
// Attached to a running process: the allocator is the first definition in the global scope
// (the library, loaded there by dlopen, is not in it), looked up again now.
void forward_to_global_scope(void);
