/* Allocations whose stacks share their outer frames and part in the middle, in a seeded order,
 * from four threads: plain recursion, functions with frame pointers (their CFA from rbp), a
 * function that keeps its data in rbp across the call (rbp differs from call to call), a
 * signal handler deep in a recursion, and qsort's comparator. Built -O2 without frame pointers.
 * Every block is kept, so the report at exit holds each stack with its exact count.
 * argv[1]: the seed. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>

#define CALLS 1500
#define THREADS 4

static uint64_t seed_given;
static void *volatile last_block;
static __thread int signal_size;

static void keep(int size)
{
    last_block = malloc((size_t)size);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) static void descend(int depth, int size)
{
    if (depth <= 1)
        keep(size);
    else
        descend(depth - 1, size);
    __asm__ volatile("" ::: "memory"); /* no tail call: every level keeps its frame */
}

__attribute__((noinline, optimize("no-omit-frame-pointer"))) static void descend_with_fp(int depth, int size)
{
    if (depth <= 1)
        descend(2, size);
    else
        descend_with_fp(depth - 1, size);
    __asm__ volatile("" ::: "memory");
}

/* Seven values live across the call: one of them lives in rbp. */
__attribute__((noinline)) static long data_in_rbp(long a, int depth, int size)
{
    long b = a * 3, c = a ^ 5, d = a + 7, e = a * 11, f = a - 13, g = a * 17;
    __asm__ volatile("" : "+r"(b), "+r"(c), "+r"(d), "+r"(e), "+r"(f), "+r"(g));
    descend(depth, size);
    __asm__ volatile("" : "+r"(a), "+r"(b), "+r"(c), "+r"(d), "+r"(e), "+r"(f), "+r"(g));
    return a + b + c + d + e + f + g;
}

static void on_signal(int sig)
{
    keep(signal_size + sig - SIGUSR1);
}

__attribute__((noinline)) static void signal_below(int depth, int size)
{
    if (depth > 1) {
        signal_below(depth - 1, size);
    } else {
        signal_size = size;
        raise(SIGUSR1);
    }
    __asm__ volatile("" ::: "memory");
}

static int compare_and_keep(const void *left, const void *right)
{
    keep(7000);
    return (*(const int *)left > *(const int *)right) - (*(const int *)left < *(const int *)right);
}

static void calls(uint64_t seed, int thread)
{
    for (int i = 0; i < CALLS; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        int path = (int)(seed >> 60) % 6, depth = (int)(seed >> 40) % 20 + 1;
        int size = 100 + thread * 1000 + path * 64 + depth;
        switch (path) {
        case 0:
            descend(depth, size);
            break;
        case 1:
            data_in_rbp((long)(seed >> 8), depth, size);
            break;
        case 2:
            descend_with_fp(depth, size);
            break;
        case 3:
            descend_with_fp(depth, size - 20);
            data_in_rbp((long)seed, depth, size);
            break;
        case 4:
            signal_below(depth, size);
            break;
        default: {
            int values[4] = {(int)seed, (int)(seed >> 16), (int)(seed >> 32), (int)(seed >> 48)};
            qsort(values, 4, sizeof *values, compare_and_keep);
        }
        }
    }
}

static void *thread_body(void *arg)
{
    uintptr_t thread = (uintptr_t)arg;
    calls(seed_given * 7919 + thread, (int)thread);
    return NULL;
}

int main(int argc, char **argv)
{
    seed_given = argc > 1 ? strtoull(argv[1], NULL, 10) : 1;
    signal(SIGUSR1, on_signal);
    pthread_t threads[THREADS - 1];
    for (uintptr_t t = 1; t < THREADS; t++)
        pthread_create(&threads[t - 1], NULL, thread_body, (void *)t);
    calls(seed_given, 0);
    for (int t = 0; t < THREADS - 1; t++)
        pthread_join(threads[t], NULL);
    return 0;
}
