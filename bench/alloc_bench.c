/* alloc_bench THREADS CALLS LEAK_PERMILLE [START_DELAY_MS [DEPTH]]
 * Each thread makes CALLS malloc/free pairs with sizes 24/64/320/4096 and
 * leaks LEAK_PERMILLE per mille of them, DEPTH calls below its start routine.
 * Prints "calls N elapsed_ns T" for the timed part only (after the start
 * delay, which lets a tracer attach). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static const size_t sizes[] = {24, 64, 320, 4096};
static long calls, permille, depth;
static pthread_barrier_t start;

static void *loop(void *arg)
{
    uint64_t state = 0x9e3779b97f4a7c15ULL ^ (uintptr_t)arg;
    void *ring[64] = {0};
    pthread_barrier_wait(&start);
    for (long i = 0; i < calls; i++) {
        void *p = malloc(sizes[i & 3]);
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        if ((long)((state >> 33) % 1000) < permille)
            continue; /* leaked */
        free(ring[i & 63]);
        ring[i & 63] = p;
    }
    for (int i = 0; i < 64; i++)
        free(ring[i]);
    return NULL;
}

__attribute__((noinline)) static void *descend(long below, void *arg)
{
    void *result = below > 0 ? descend(below - 1, arg) : loop(arg);
    __asm__ volatile("" ::: "memory"); /* no tail call: every level keeps its frame */
    return result;
}

static void *work(void *arg)
{
    return descend(depth, arg);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: alloc_bench THREADS CALLS LEAK_PERMILLE [START_DELAY_MS]\n");
        return 2;
    }
    int threads = atoi(argv[1]);
    calls = atol(argv[2]);
    permille = atol(argv[3]);
    if (argc > 4)
        usleep(atol(argv[4]) * 1000);
    if (argc > 5)
        depth = atol(argv[5]);
    pthread_t ids[64];
    pthread_barrier_init(&start, NULL, threads + 1);
    for (long t = 0; t < threads; t++)
        pthread_create(&ids[t], NULL, work, (void *)t);
    struct timespec a, b;
    pthread_barrier_wait(&start);
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int t = 0; t < threads; t++)
        pthread_join(ids[t], NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    long long ns = (b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec);
    /* every iteration is one malloc and, except for leaks, one free */
    printf("calls %ld elapsed_ns %lld\n", 2 * calls * threads, ns);
    return 0;
}
