/* Known allocation shapes, one call site each (see tests/test_exact_counts.py).
 * "shapes" runs and exits; "shapes wait" prints "ready", blocks on stdin,
 * then frees 7 blocks made before the trace, allocates, prints "done" and
 * waits for stdin to close. Output uses write(2): stdio would allocate. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *volatile keep[256];
static int kept;
#define KEEP(p) (keep[kept++ % 256] = (p))

__attribute__((noinline)) void *leak_malloc(void) { return malloc(100); }
__attribute__((noinline)) void *leak_calloc(void) { return calloc(8, 16); }
__attribute__((noinline)) void *chain_start(void) { return malloc(16); }
__attribute__((noinline)) void *realloc_grow(void *p, size_t n) { return realloc(p, n); }
__attribute__((noinline)) void realloc_to_zero(void) { void *p = malloc(50); KEEP(realloc(p, 0)); }
__attribute__((noinline)) void *realloc_null(void) { return realloc(NULL, 70); }
__attribute__((noinline)) void *before_failed_realloc(void) { return malloc(40); }
__attribute__((noinline)) void *failed_realloc(void *p) { return realloc(p, SIZE_MAX / 2); }
__attribute__((noinline)) void *leak_posix_memalign(void)
{
    void *p = NULL;
    return posix_memalign(&p, 64, 200) == 0 ? p : NULL;
}
__attribute__((noinline)) void failed_posix_memalign(void)
{
    void *p = NULL;
    if (posix_memalign(&p, 3, 10) == 0)   /* not a power of two: EINVAL */
        abort();
}
__attribute__((noinline)) void *leak_aligned_alloc(void) { return aligned_alloc(64, 256); }
__attribute__((noinline)) void *leak_memalign(void) { return memalign(32, 96); }
__attribute__((noinline)) void *leak_valloc(void) { return valloc(1000); }
__attribute__((noinline)) void *leak_pvalloc(void) { return pvalloc(5000); }
__attribute__((noinline)) void *leak_reallocarray(void) { return reallocarray(NULL, 10, 30); }
__attribute__((noinline)) void churn(void)
{
    for (int i = 0; i < 10000; i++) {
        void *p = malloc(64 + i % 100);
        KEEP(p);
        free(p);
    }
}

static void say(const char *text) { write(1, text, strlen(text)); }

static void wait_for_input(void)
{
    char c;
    if (read(0, &c, 1) != 1)
        _exit(3);
}

int main(int argc, char **argv)
{
    int waiting = argc > 1 && strcmp(argv[1], "wait") == 0;
    void *before[7];
    if (waiting) {
        for (int i = 0; i < 7; i++)
            before[i] = malloc(33);
        say("ready\n");
        wait_for_input();
        for (int i = 0; i < 7; i++)
            free(before[i]);
    }
    for (int i = 0; i < 10; i++) KEEP(leak_malloc());
    for (int i = 0; i < 5; i++) KEEP(leak_calloc());
    for (int i = 0; i < 3; i++) {
        void *p = chain_start();
        p = realloc_grow(p, 64);
        p = realloc_grow(p, 200000);   /* above the mmap threshold: moves */
        p = realloc_grow(p, 5000);     /* back to the heap: moves */
        KEEP(p);
    }
    realloc_to_zero();
    KEEP(realloc_null());
    void *survivor = before_failed_realloc();
    if (failed_realloc(survivor) != NULL)
        abort();
    KEEP(survivor);
    for (int i = 0; i < 3; i++) KEEP(leak_posix_memalign());
    failed_posix_memalign();
    for (int i = 0; i < 2; i++) KEEP(leak_aligned_alloc());
    KEEP(leak_memalign());
    KEEP(leak_valloc());
    KEEP(leak_pvalloc());
    KEEP(leak_reallocarray());
    for (int i = 0; i < 5; i++) free(NULL);
    churn();
    if (waiting) {
        say("done\n");
        while (read(0, &(char){0}, 1) == 1)
            ;
    }
    return 0;
}
