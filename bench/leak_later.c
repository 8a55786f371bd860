// leak_later SECONDS LEAK_AFTER BYTES_PER_S: two threads keep a steady working set (64 MiB in
// 256-byte blocks, replaced at random) for SECONDS; from LEAK_AFTER on, injected_leak() also
// keeps BYTES_PER_S a second in 1 KiB blocks, never freed. Prints "leaking" when it starts.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define WORKING_BLOCKS (64 << 20) / 256 / 2

static double seconds, leak_after, leak_rate;
static struct timespec started;

static double elapsed(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - started.tv_sec) + (double)(now.tv_nsec - started.tv_nsec) / 1e9;
}

__attribute__((noinline)) static void *steady_block(void)
{
    return malloc(256);
}

static void *steady(void *seed)
{
    void **blocks = calloc(WORKING_BLOCKS, sizeof *blocks);
    unsigned state = (unsigned)(size_t)seed;
    for (long i = 0; i < WORKING_BLOCKS; i++)
        blocks[i] = steady_block();
    while (elapsed() < seconds) {
        for (int i = 0; i < 1000; i++) {
            state = state * 1103515245 + 12345;
            long at = (long)(state >> 8) % WORKING_BLOCKS;
            free(blocks[at]);
            blocks[at] = steady_block();
        }
        struct timespec pause = {0, 10000000};  // some 100,000 replacements a second a thread
        nanosleep(&pause, NULL);
    }
    return NULL;
}

__attribute__((noinline)) static void injected_leak(long bytes)
{
    for (long made = 0; made < bytes; made += 1024) {
        void *volatile kept = malloc(1024);
        (void)kept;
    }
}

int main(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    seconds = atof(argv[1]), leak_after = atof(argv[2]), leak_rate = atof(argv[3]);
    clock_gettime(CLOCK_MONOTONIC, &started);
    pthread_t threads[2];
    for (long i = 0; i < 2; i++)
        pthread_create(&threads[i], NULL, steady, (void *)(i + 1));
    int leaking = 0;
    while (elapsed() < seconds) {
        struct timespec tenth = {0, 100000000};
        nanosleep(&tenth, NULL);
        if (elapsed() >= leak_after) {
            if (!leaking)
                printf("leaking\n"), fflush(stdout), leaking = 1;
            injected_leak((long)(leak_rate / 10));
        }
    }
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);
    return 0;
}
