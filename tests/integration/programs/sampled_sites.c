// sampled_sites MIB: three sites that each keep MIB MiB (small_site: 64-byte blocks,
// page_site: 4096-byte ones, big_site: 1 MiB ones) while churn() allocates and frees
// 16 x MIB MiB in 1 KiB blocks between them; prints "done" and exits. "sampled_sites MIB
// wait" prints "ready" first and waits for a line on stdin, and after "done" for its end.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *volatile *kept;
static long next;

__attribute__((noinline)) static void keep(size_t size, long bytes)
{
    for (long made = 0; made < bytes; made += (long)size)
        kept[next++] = malloc(size);
}

__attribute__((noinline)) static void small_site(long bytes)
{
    keep(64, bytes);
}

__attribute__((noinline)) static void page_site(long bytes)
{
    keep(4096, bytes);
}

__attribute__((noinline)) static void big_site(long bytes)
{
    keep(1 << 20, bytes);
}

__attribute__((noinline)) static void churn(long bytes)
{
    for (long made = 0; made < bytes; made += 1024) {
        void *volatile block = malloc(1024);
        free(block);
    }
}

int main(int argc, char **argv)
{
    long bytes = (argc > 1 ? atol(argv[1]) : 64) << 20;
    int waits = argc > 2 && strcmp(argv[2], "wait") == 0;
    if (waits) {
        puts("ready");
        fflush(stdout);
        getchar();
    }
    kept = calloc((size_t)(bytes / 64 + bytes / 4096 + bytes / (1 << 20) + 3), sizeof *kept);
    small_site(bytes);
    churn(8 * bytes);
    page_site(bytes);
    churn(8 * bytes);
    big_site(bytes);
    puts("done");
    fflush(stdout);
    while (waits && getchar() != EOF)
        ;
    return 0;
}
