/* A known shape over time (issue 45's fixture): a spike of SPIKE_BLOCKS blocks of 1 MiB
 * (spike_site) freed again, then LEAK blocks of 4,096 bytes kept (leak_site), then churn:
 * CHURN blocks of 32 bytes (churn_site), each freed before the next is made.
 * "spike_leak LEAK [THREADS]" runs and exits; with THREADS, that many threads then each make
 * THREAD_CHURN churn blocks and THREAD_LEAK leak blocks at once. Output uses write(2): stdio
 * would allocate. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SPIKE_BLOCKS 40
#define LEAK_BYTES 4096
#define CHURN 100000
#define THREAD_CHURN 20000
#define THREAD_LEAK 10
#define MOST_THREADS 16

void *volatile held[SPIKE_BLOCKS];
void *volatile sink;

__attribute__((noinline)) void *spike_site(void) { return malloc(1 << 20); }
__attribute__((noinline)) void *leak_site(void) { return malloc(LEAK_BYTES); }
__attribute__((noinline)) void *churn_site(void) { return malloc(32); }

static void *thread_work(void *arg)
{
    for (int i = 0; i < THREAD_CHURN; i++) {
        void *block = churn_site();
        free(block);
        if (i % (THREAD_CHURN / THREAD_LEAK) == 0)
            sink = leak_site();
    }
    return arg;
}

int main(int argc, char **argv)
{
    int leaks = argc > 1 ? atoi(argv[1]) : 100;
    int threads = argc > 2 ? atoi(argv[2]) : 0;
    for (int i = 0; i < SPIKE_BLOCKS; i++) {
        held[i] = spike_site();
        memset(held[i], 1, 64);
    }
    for (int i = 0; i < SPIKE_BLOCKS; i++)
        free(held[i]);
    for (int i = 0; i < leaks; i++)
        sink = leak_site();
    for (int i = 0; i < CHURN; i++) {
        sink = churn_site();
        free(sink);
    }
    pthread_t started[MOST_THREADS];
    threads = threads < MOST_THREADS ? threads : MOST_THREADS;
    for (int i = 0; i < threads; i++)
        pthread_create(&started[i], NULL, thread_work, NULL);
    for (int i = 0; i < threads; i++)
        pthread_join(started[i], NULL);
    write(1, "done\n", 5);
    return 0;
}
