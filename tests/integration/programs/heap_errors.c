// Heap misuse with known bytes, for malloc_debug's allocator-side options
// (run with leaktrace's preload library). Each mode prints what it did on stdout:
//   rear         writes 0x11 0x22 just past a 100-byte block, frees it
//   front        writes 0x00 just before a 40-byte block, frees it
//   after_free   frees a 64-byte block, writes 0x01 at [10], exits (free_track checks at exit)
//   double_free  frees a 32-byte block twice (double_free_large: a 4000-byte one, with a
//                larger allocation between the frees)
//   unknown      frees a pointer into a global array
//   fill         prints how many bytes of malloc(100), calloc(100) and the growth of
//                realloc(100 -> 200) are 0xeb, and of a freed block are 0xef
//   usable       prints malloc_usable_size(malloc(100))
#define _GNU_SOURCE
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char not_from_malloc[64];

static size_t count_bytes(const unsigned char *p, size_t from, size_t to, unsigned char value)
{
    size_t n = 0;
    for (size_t i = from; i < to; i++)
        n += p[i] == value;
    return n;
}

__attribute__((noinline)) void corrupt_rear(void)
{
    unsigned char *p = malloc(100);
    printf("block %p\n", (void *)p);
    fflush(stdout);
    p[100] = 0x11;
    p[101] = 0x22;
    free(p);
}

__attribute__((noinline)) void corrupt_front(void)
{
    unsigned char *p = malloc(40);
    printf("block %p\n", (void *)p);
    fflush(stdout);
    p[-1] = 0x00;
    free(p);
}

__attribute__((noinline)) void write_after_free(void)
{
    unsigned char *volatile p = malloc(64);
    printf("block %p\n", (void *)p);
    fflush(stdout);
    free(p);
    p[10] = 0x01;
}

__attribute__((noinline)) void free_twice(void)
{
    void *volatile p = malloc(32);
    printf("block %p\n", p);
    fflush(stdout);
    free(p);
    free(p);
}

// A 4000-byte block freed, sorted into one of glibc's large bins by a larger request
// (which writes 32 bytes of links into it), then freed again.
__attribute__((noinline)) void free_large_twice(void)
{
    void *volatile p = malloc(4000);
    void *volatile barrier = malloc(16);   // keeps p's chunk from merging into the top chunk
    printf("block %p\n", p);
    fflush(stdout);
    free(p);
    void *volatile larger = malloc(8000);
    free(p);
    free(larger);
    free(barrier);
}

__attribute__((noinline)) void free_unknown(void)
{
    char *volatile inside_array = not_from_malloc + 32;
    printf("block %p\n", (void *)inside_array);
    fflush(stdout);
    free(inside_array);
}

static void show_fills(void)
{
    unsigned char *m = malloc(100), *c = calloc(1, 100), *r = malloc(100);
    memset(r, 0, 100);
    r = realloc(r, 200);
    printf("malloc %zu calloc %zu realloc_kept %zu realloc_grown %zu\n", count_bytes(m, 0, 100, 0xeb),
           count_bytes(c, 0, 100, 0xeb), count_bytes(r, 0, 100, 0xeb), count_bytes(r, 100, 200, 0xeb));
    unsigned char *volatile f = malloc(100);
    free(f);
    printf("freed %zu\n", count_bytes(f, 0, 100, 0xef));
    free(m);
    free(c);
    free(r);
}

static void show_usable_size(void)
{
    printf("usable %zu\n", malloc_usable_size(malloc(100)));
}

static const struct {
    const char *name;
    void (*run)(void);
} modes[] = {
    {"rear", corrupt_rear}, {"front", corrupt_front}, {"after_free", write_after_free},
    {"double_free", free_twice}, {"double_free_large", free_large_twice}, {"unknown", free_unknown},
    {"fill", show_fills}, {"usable", show_usable_size},
};

int main(int argc, char **argv)
{
    for (size_t i = 0; argc > 1 && i < sizeof modes / sizeof modes[0]; i++)
        if (!strcmp(argv[1], modes[i].name))
            modes[i].run();
    puts("done");
    return 0;
}
