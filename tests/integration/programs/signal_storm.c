// Four threads allocate and free while the main thread sends them (and itself)
// SIGRTMAX-19 (stack toggle) every 100 us and SIGRTMAX-17 (heap dump) every 1 ms.
// Each thread keeps every 100th block: 1000 blocks per thread of odd sizes
// 1001 + 2 * ((i / 100) % 64), so the final live set is known exactly.
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define THREADS 4
#define CALLS 100000

static atomic_int running = THREADS;
static void *kept[THREADS][CALLS / 100];

static void *work(void *arg)
{
    long t = (long)arg;
    for (int i = 0; i < CALLS; i++) {
        void *p = malloc(1001 + 2 * ((i / 100) % 64));
        if (i % 100 == 0)
            kept[t][i / 100] = p;
        else
            free(p);
    }
    atomic_fetch_sub(&running, 1);
    return NULL;
}

int main(void)
{
    pthread_t threads[THREADS];
    for (long t = 0; t < THREADS; t++)
        pthread_create(&threads[t], NULL, work, (void *)t);
    long signals = 0;
    for (long round = 0; atomic_load(&running); round++) {
        for (int t = 0; t < THREADS; t++)
            pthread_kill(threads[t], SIGRTMAX - 19);
        raise(SIGRTMAX - 19);
        if (round % 10 == 0)   // a dump costs a walk of the table: a few hundred a second at most
            pthread_kill(threads[round / 10 % THREADS], SIGRTMAX - 17);
        signals += THREADS + 1 + (round % 10 == 0);
        usleep(100);
    }
    for (int t = 0; t < THREADS; t++)
        pthread_join(threads[t], NULL);
    printf("signals %ld\n", signals);
    return 0;
}
