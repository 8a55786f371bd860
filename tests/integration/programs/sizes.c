/* One block of each size in argv[1..], all from alloc_size. */
#include <stdlib.h>

void *volatile keep[64];

__attribute__((noinline)) void *alloc_size(size_t n) { return malloc(n); }

int main(int argc, char **argv)
{
    for (int i = 1; i < argc && i < 64; i++)
        keep[i] = alloc_size(strtoul(argv[i], NULL, 10));
    return 0;
}
