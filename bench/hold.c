/* hold N: allocates N blocks of 32 bytes from four call sites, then sleeps. */
#include <stdlib.h>
#include <unistd.h>

static void **blocks;

__attribute__((noinline)) void hold_a(long i)
{
    blocks[i] = malloc(32);
}
__attribute__((noinline)) void hold_b(long i)
{
    blocks[i] = malloc(32);
}
__attribute__((noinline)) void hold_c(long i)
{
    blocks[i] = malloc(32);
}
__attribute__((noinline)) void hold_d(long i)
{
    blocks[i] = malloc(32);
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 100000;
    blocks = calloc(n, sizeof *blocks);
    for (long i = 0; i < n; i++) {
        switch (i & 3) {
        case 0:
            hold_a(i);
            break;
        case 1:
            hold_b(i);
            break;
        case 2:
            hold_c(i);
            break;
        default:
            hold_d(i);
            break;
        }
    }
    sleep(600);
    return 0;
}
