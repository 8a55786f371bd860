// What the leak-kind programs share (leak_kinds.c, leak_fork.c): blocks made zeroed by a
// function of their own, and a scrub of the stack below the caller, so that no stale copy of
// a pointer stays behind to keep a block reachable.
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) static void *make(size_t n)
{
    void *block = malloc(n);
    memset(block, 0, n);
    return block;
}

__attribute__((noinline)) static void scrub(void)
{
    volatile char below[8192];
    memset((char *)below, 0, sizeof below);
}
