/* sampling_cost THREADS CHUNKS PAIRS
 * What an interposed malloc/free pair costs over glibc's own, measured in one process so
 * that both see the same machine: each thread runs CHUNKS chunks of PAIRS pairs of
 * alloc_bench's mix (24/64/320/4096 bytes, 1% kept until the chunk's end), alternately
 * through malloc/free (leaktrace's library, when preloaded) and through __libc_malloc/
 * __libc_free (glibc's, never interposed). Prints "direct NS interposed NS" per pair: the
 * medians over all threads' chunks. A VM whose CPU is taken away for a while slows a few
 * chunks of both kinds, not one kind. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void *__libc_malloc(size_t);
void __libc_free(void *);

static const size_t sizes[] = {24, 64, 320, 4096};
static long chunks, pairs;
static double *timings[2]; /* [0]: direct, [1]: interposed; chunk by chunk, thread after thread */
static pthread_barrier_t start;

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

/* One chunk; the function pointers keep both kinds of call out of line, as a program's are. */
static double chunk(void *(*allocate)(size_t), void (*release)(void *), uint64_t *state)
{
    void *ring[64] = {0}, *kept[1024];
    long held = 0;
    double began = now_ns();
    for (long i = 0; i < pairs; i++) {
        void *p = allocate(sizes[i & 3]);
        *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
        if ((*state >> 33) % 100 == 0 && held < 1024) {
            kept[held++] = p;
            continue;
        }
        release(ring[i & 63]);
        ring[i & 63] = p;
    }
    for (int i = 0; i < 64; i++)
        release(ring[i]);
    while (held)
        release(kept[--held]);
    return (now_ns() - began) / pairs;
}

static void *loop(void *arg)
{
    long thread = (long)arg;
    uint64_t state = 0x9e3779b97f4a7c15ULL ^ (uint64_t)thread;
    pthread_barrier_wait(&start);
    for (long c = 0; c < chunks; c++) {
        int first = c & 1; /* the order alternates too */
        timings[first][thread * chunks + c] =
            first ? chunk(malloc, free, &state) : chunk(__libc_malloc, __libc_free, &state);
        timings[!first][thread * chunks + c] =
            first ? chunk(__libc_malloc, __libc_free, &state) : chunk(malloc, free, &state);
    }
    return NULL;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *values, long count)
{
    qsort(values, (size_t)count, sizeof *values, by_value);
    return count % 2 ? values[count / 2] : (values[count / 2 - 1] + values[count / 2]) / 2;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: sampling_cost THREADS CHUNKS PAIRS\n");
        return 2;
    }
    long threads = atol(argv[1]);
    chunks = atol(argv[2]);
    pairs = atol(argv[3]);
    if (threads < 1 || threads > 64 || chunks < 1 || pairs < 64) {
        fprintf(stderr, "sampling_cost: THREADS 1 to 64, CHUNKS at least 1, PAIRS at least 64\n");
        return 2;
    }
    for (int kind = 0; kind < 2; kind++)
        timings[kind] = __libc_malloc(sizeof(double) * (size_t)(threads * chunks));
    pthread_t ids[64];
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    for (long t = 0; t < threads; t++)
        pthread_create(&ids[t], NULL, loop, (void *)t);
    for (long t = 0; t < threads; t++)
        pthread_join(ids[t], NULL);
    printf("direct %.2f interposed %.2f\n", median(timings[0], threads * chunks), median(timings[1], threads * chunks));
    return 0;
}
