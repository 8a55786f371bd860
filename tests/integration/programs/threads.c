/* N threads (argv[1], default 2) start together and each leaks 7 blocks of 48
 * bytes from thread_leak, its very first allocations, while churning. */
#include <pthread.h>
#include <stdlib.h>

void *volatile keep[4096];
static pthread_barrier_t start;

__attribute__((noinline)) void *thread_leak(void) { return malloc(48); }

static void *worker(void *arg)
{
    long id = (long)arg;
    pthread_barrier_wait(&start);
    for (int i = 0; i < 7; i++) {
        keep[id * 7 + i] = thread_leak();
        free(malloc(24 + i));
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 2;
    pthread_t threads[64];
    pthread_barrier_init(&start, NULL, n);
    for (long i = 0; i < n; i++)
        pthread_create(&threads[i], NULL, worker, (void *)i);
    for (int i = 0; i < n; i++)
        pthread_join(threads[i], NULL);
    return 0;
}
