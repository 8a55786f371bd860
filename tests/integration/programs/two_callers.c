/* Two threads call malloc(77) at the same moment (see barrier_alloc.c). */
#include <pthread.h>
#include <stdlib.h>

void *volatile keep[2];

__attribute__((noinline)) void *meet_in_malloc(void) { return malloc(77); }

static void *worker(void *arg)
{
    keep[(long)arg] = meet_in_malloc();
    return NULL;
}

int main(void)
{
    pthread_t a, b;
    pthread_create(&a, NULL, worker, (void *)0);
    pthread_create(&b, NULL, worker, (void *)1);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    return 0;
}
