/* alloc_bench THREADS CALLS LEAK_PERMILLE [START_DELAY_MS [DEPTH]]
 * Each thread makes CALLS malloc/free pairs with sizes 24/64/320/4096 and
 * leaks LEAK_PERMILLE per mille of them, DEPTH calls below its start routine.
 * Prints "calls N elapsed_ns T" for the timed part only (after the start
 * delay, which lets a tracer attach): from the first thread's start to the
 * last thread's end, as each thread reads the clock itself. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static const size_t sizes[] = {24, 64, 320, 4096};
static long calls, permille, depth;
static pthread_barrier_t start;
static struct timespec began[64], ended[64]; /* each thread's own timed part */

static long long ns_of(struct timespec t)
{
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void *loop(void *arg)
{
    uint64_t state = 0x9e3779b97f4a7c15ULL ^ (uintptr_t)arg;
    void *ring[64] = {0};
    pthread_barrier_wait(&start);
    clock_gettime(CLOCK_MONOTONIC, &began[(uintptr_t)arg]);
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
    clock_gettime(CLOCK_MONOTONIC, &ended[(uintptr_t)arg]);
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
    if (threads < 1 || threads > 64) {
        fprintf(stderr, "alloc_bench: THREADS must be 1 to 64\n");
        return 2;
    }
    calls = atol(argv[2]);
    permille = atol(argv[3]);
    if (argc > 4)
        usleep(atol(argv[4]) * 1000);
    if (argc > 5)
        depth = atol(argv[5]);
    pthread_t ids[64];
    pthread_barrier_init(&start, NULL, threads);
    for (long t = 0; t < threads; t++)
        pthread_create(&ids[t], NULL, work, (void *)t);
    long long first = 0, last = 0; /* from the first thread's start to the last one's end */
    for (int t = 0; t < threads; t++) {
        pthread_join(ids[t], NULL);
        if (!t || ns_of(began[t]) < first)
            first = ns_of(began[t]);
        if (ns_of(ended[t]) > last)
            last = ns_of(ended[t]);
    }
    long long ns = last - first;
    /* every iteration is one malloc and, except for leaks, one free */
    printf("calls %ld elapsed_ns %lld\n", 2 * calls * threads, ns);
    return 0;
}
