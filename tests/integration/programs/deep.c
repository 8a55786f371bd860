/* deep DEPTH: one 100-byte block allocated DEPTH calls of descend() down. */
#include <stdlib.h>

void *volatile keep;

__attribute__((noinline)) void descend(int depth)
{
    if (depth == 0)
        keep = malloc(100);
    else
        descend(depth - 1);
    __asm__ volatile("" ::: "memory");   /* no tail call: every level keeps its frame */
}

int main(int argc, char **argv)
{
    descend(atoi(argv[1]));
    return 0;
}
