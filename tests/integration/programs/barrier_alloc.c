/* An allocator library whose first two malloc(77) calls wait for each other,
 * so that two threads are inside malloc at the same moment. It hands the
 * real work to glibc through its __libc_* entry points. */
#include <pthread.h>
#include <stddef.h>

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);

static pthread_barrier_t meet;
static int waits = 2;

__attribute__((constructor)) static void init(void) { pthread_barrier_init(&meet, NULL, 2); }

void *malloc(size_t n)
{
    if (n == 77 && __atomic_fetch_sub(&waits, 1, __ATOMIC_SEQ_CST) > 0)
        pthread_barrier_wait(&meet);
    return __libc_malloc(n);
}

void free(void *p) { __libc_free(p); }
