// overwritten: each block's only pointer, a global, is overwritten at once, and main returns
// (exit runs the destructors). The allocator's frames (and leaktrace's library's) left each
// address below main's, where exit's frames lie at the exit hold. valgrind: definitely lost,
// 8 x 48 bytes.
#include <stdlib.h>

void *volatile kept;

__attribute__((noinline)) static void lose(int count)
{
    for (int i = 0; i < count; i++)
        kept = malloc(48);
    kept = 0;
}

int main(void)
{
    lose(8);
    return 0;
}
