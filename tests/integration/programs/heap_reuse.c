// heap_reuse LEAKS: loses LEAKS blocks of 64 bytes, then makes and frees 6000 blocks (a tracer
// that keeps a table of blocks in this heap grows it meanwhile), then keeps 400 blocks of
// 1 KiB to 128 KiB reachable without writing to them: the heap hands them its freed memory,
// whatever was left there. valgrind: LEAKS x 64 bytes definitely lost, the rest reachable.
#include <stdlib.h>
#include <string.h>

#define CHURN 6000
#define KEPT 400

static void *churn[CHURN];
void *volatile kept[KEPT];

__attribute__((noinline)) static void lose(int count)
{
    for (int i = 0; i < count; i++) {
        void *volatile block = malloc(64);
        memset(block, i, 64);
    }
}

int main(int argc, char **argv)
{
    int leaks = argc > 1 ? atoi(argv[1]) : 5;
    lose(leaks);
    for (int i = 0; i < CHURN; i++)
        churn[i] = malloc(32 + i % 96);
    for (int i = 0; i < CHURN; i++)
        free(churn[i]);
    memset(churn, 0, sizeof churn);
    for (int i = 0; i < KEPT; i++)
        kept[i] = malloc(1024u << (i % 8));
    return 0;
}
