// Built as chromium is: frame pointers and no unwind tables, with more code than a 512-byte
// page index of 2^16 pages covers (a padding section of BIG_TEXT_MIB), and one function of
// big_text_cfi.c (CFI, no frame pointer) past the padding, called back and forth. Each size
// is allocated once and kept: 7001 by main, 7002 through the CFI function, 7003 by a thread.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

void *through_cfi(size_t size, void *(*allocate)(size_t));

__asm__(".pushsection .text.padding,\"ax\",@progbits\n"
        ".skip " BIG_TEXT_MIB " * 1024 * 1024, 0xcc\n"
        ".popsection");

static void *volatile kept[3];

__attribute__((noinline)) void *allocate_here(size_t size)
{
    void *block = malloc(size);
    __asm__ volatile("" ::: "memory");
    return block;
}

__attribute__((noinline)) static void *thread_body(void *unused)
{
    kept[2] = allocate_here(7003);
    return unused;
}

int main(void)
{
    kept[0] = malloc(7001);
    kept[1] = through_cfi(7002, allocate_here);
    pthread_t thread;
    if (pthread_create(&thread, NULL, thread_body, NULL) != 0 || pthread_join(thread, NULL) != 0)
        return 1;
    puts("done");
    return 0;
}
