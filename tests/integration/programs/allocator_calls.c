/* Every allocating call an allocator exports, from THREADS threads at once, each leaving a
 * known number of blocks per call site (per thread: 7 malloc, 5 calloc, 4 realloc'd, 3
 * posix_memalign, 2 aligned_alloc) and freeing the rest; then it prints "done" and waits
 * for a line on stdin (or exits at once with "exit"). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROUNDS 200
void *volatile kept[64 * 32];
static int threads;

__attribute__((noinline)) void *leak_malloc(void) { return malloc(24); }
__attribute__((noinline)) void *leak_calloc(void) { return calloc(5, 8); }
__attribute__((noinline)) void *leak_realloc(void *p) { return realloc(p, 96); }
__attribute__((noinline)) void *leak_memalign(void)
{
    void *p = NULL;
    return posix_memalign(&p, 64, 128) == 0 ? p : NULL;
}
__attribute__((noinline)) void *leak_aligned(void) { return aligned_alloc(32, 160); }

static void *work(void *arg)
{
    int base = (int)(long)arg * 32, at = base;
    for (int round = 0; round < ROUNDS; round++) {  // churn: all freed
        void *a = malloc(round + 1), *b = calloc(round + 1, 3);
        a = realloc(a, round + 50);
        free(b);
        free(a);
        free(NULL);
    }
    for (int i = 0; i < 7; i++) kept[at++] = leak_malloc();
    for (int i = 0; i < 5; i++) kept[at++] = leak_calloc();
    for (int i = 0; i < 4; i++) kept[at++] = leak_realloc(malloc(8));
    for (int i = 0; i < 3; i++) kept[at++] = leak_memalign();
    for (int i = 0; i < 2; i++) kept[at++] = leak_aligned();
    return NULL;
}

int main(int argc, char **argv)
{
    threads = argc > 1 ? atoi(argv[1]) : 4;
    pthread_t ids[64];
    for (int i = 0; i < threads && i < 64; i++) pthread_create(&ids[i], NULL, work, (void *)(long)i);
    for (int i = 0; i < threads && i < 64; i++) pthread_join(ids[i], NULL);
    printf("done\n");
    fflush(stdout);
    if (argc > 2 && strcmp(argv[2], "exit") == 0) return 0;
    char line[8];
    return fgets(line, sizeof line, stdin) ? 0 : 1;
}
