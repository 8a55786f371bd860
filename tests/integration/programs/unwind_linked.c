/* The library tests/integration/programs/unwind.c links at start: one 4000-byte block. */
#include <stdlib.h>

void *volatile linked_kept;

__attribute__((noinline)) static void linked_inner(void)
{
    linked_kept = malloc(4000);
    __asm__ volatile("" ::: "memory");
}

void linked_alloc(void)
{
    linked_inner();
    __asm__ volatile("" ::: "memory");
}
