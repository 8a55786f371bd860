// Built -O2 -g: 8 blocks of 48 bytes from a helper inlined into site(), which main calls.
#include <stdlib.h>

void *volatile keep[8];

static inline __attribute__((always_inline)) void *make_block(size_t n)
{
    return malloc(n);
}

__attribute__((noinline)) void site(int i)
{
    keep[i] = make_block(48);
}

int main(void)
{
    for (int i = 0; i < 8; i++)
        site(i);
    return 0;
}
