// unkept_blocks SIZE ROUNDS [wait]: three threads each hold 512 blocks at once (two in three of
// SIZE bytes, the rest of 48, from malloc and the memalign family), then pass every one through
// realloc, reallocarray, malloc_usable_size and free; sampled, many share the page their block
// starts in (so a filter byte) with a kept one. Any call that fails, loses bytes or reports a short size ends the program with status 1
// and a line saying which. Prints "checked N" (the calls made) and exits 0. With "wait":
// "ready", then the work once a line arrives on stdin, then waits for EOF.
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HELD 512
#define THREADS 3

static size_t big;
static long rounds;

static void fail(const char *what, size_t bytes)
{
    printf("FAILED: %s of %zu bytes\n", what, bytes);
    fflush(stdout);
    _exit(1);
}

static void check_filled(const unsigned char *block, size_t bytes, unsigned char value, const char *what)
{
    for (size_t i = 0; i < bytes; i++)
        if (block[i] != value)
            fail(what, bytes);
}

// One block's life through the resizing calls; returns the calls made.
static long resize_and_free(unsigned char *block, size_t size, unsigned char value)
{
    if (malloc_usable_size(block) < size)
        fail("malloc_usable_size", size);
    unsigned char *grown = realloc(block, size * 2);
    if (!grown)
        fail("realloc", size * 2);
    check_filled(grown, size, value, "realloc's copy");
    memset(grown, value, size * 2);
    unsigned char *array = reallocarray(grown, 3, size);
    if (!array)
        fail("reallocarray", size * 3);
    check_filled(array, size * 2, value, "reallocarray's copy");
    if (malloc_usable_size(array) < size * 3)
        fail("malloc_usable_size after reallocarray", size * 3);
    unsigned char *shrunk = realloc(array, size / 2 + 1);
    if (!shrunk)
        fail("realloc to shrink", size / 2 + 1);
    check_filled(shrunk, size / 2 + 1, value, "a shrunk realloc's copy");
    free(shrunk);
    return 5;
}

static void *aligned(int kind, size_t size)
{
    void *block = NULL;
    switch (kind) {
    case 0:
        return memalign(64, size);
    case 1:
        return aligned_alloc(256, size);
    case 2:
        return posix_memalign(&block, 128, size) == 0 ? block : NULL;
    default:
        return valloc(size);
    }
}

static void *work(void *arg)
{
    unsigned char value = (unsigned char)(uintptr_t)arg;
    unsigned char *held[HELD];
    long calls = 0;
    for (long round = 0; round < rounds; round++) {
        for (int i = 0; i < HELD; i++) {
            size_t size = i % 3 ? big : 48;
            held[i] = i % 2 ? aligned(i / 2 % 4, size) : malloc(size);
            if (!held[i])
                fail(i % 2 ? "an aligned allocation" : "malloc", size);
            memset(held[i], value, size);
        }
        for (int i = 0; i < HELD; i++)
            calls += 1 + resize_and_free(held[i], i % 3 ? big : 48, value);
    }
    return (void *)calls;
}

static long run(void)
{
    pthread_t threads[THREADS];
    for (uintptr_t t = 0; t < THREADS; t++)
        pthread_create(&threads[t], NULL, work, (void *)(t + 1));
    long calls = 0;
    for (int t = 0; t < THREADS; t++) {
        void *made;
        pthread_join(threads[t], &made);
        calls += (long)made;
    }
    return calls;
}

int main(int argc, char **argv)
{
    big = argc > 1 ? strtoul(argv[1], NULL, 10) : 4096;
    rounds = argc > 2 ? atol(argv[2]) : 8;
    int waits = argc > 3 && strcmp(argv[3], "wait") == 0;
    if (waits) {
        puts("ready");
        fflush(stdout);
        getchar();
    }
    printf("checked %ld\n", run());
    fflush(stdout);
    while (waits && getchar() != EOF)
        ;
    return 0;
}
