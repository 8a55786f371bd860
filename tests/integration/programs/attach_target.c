// A program leaktrace attaches to while it runs: 10 blocks of 2,000 bytes made at start, and
// one of 777 lost (its only pointer cleared), CHURN threads allocating and freeing all along.
// On SIGUSR1: the 10 freed (blocks from before the attach), then 4 threads keep 50 blocks of
// 100+i bytes each, main keeps 7 of 3,000 (calloc) and 1 of 5,000 (realloc grown from 10)
// and loses one of 888; "done". On SIGUSR2: those kept freed, "freed". It says "ready" once
// its threads run.
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define CHURN 4

static void *volatile before[10];
static void *volatile kept[4][50];
static void *volatile kept_main[8];
static void *volatile churned[CHURN];
static void *volatile lost;

__attribute__((noinline)) static void lose(size_t size)
{
    lost = malloc(size);
    lost = NULL;
}

static void *churn(void *slot)
{
    long i = (long)slot;
    for (;;) {
        churned[i] = malloc(48 + i);
        free(churned[i]);
        usleep(20);
    }
    return NULL;
}

static void *keep(void *slot)
{
    long i = (long)slot;
    for (int j = 0; j < 50; j++)
        kept[i][j] = malloc(100 + i);
    return NULL;
}

int main(void)
{
    sigset_t wanted;
    sigemptyset(&wanted);
    sigaddset(&wanted, SIGUSR1);
    sigaddset(&wanted, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &wanted, NULL);
    for (int i = 0; i < 10; i++)
        before[i] = malloc(2000);
    lose(777);
    pthread_t threads[CHURN];
    for (long i = 0; i < CHURN; i++)
        pthread_create(&threads[i], NULL, churn, (void *)i);
    printf("ready\n");
    fflush(stdout);
    int sig;
    sigwait(&wanted, &sig);
    for (int i = 0; i < 10; i++) {
        free(before[i]);
        before[i] = NULL;  // a later block may take its place: no stale pointer keeps it reachable
    }
    pthread_t keepers[4];
    for (long i = 0; i < 4; i++)
        pthread_create(&keepers[i], NULL, keep, (void *)i);
    for (int i = 0; i < 4; i++)
        pthread_join(keepers[i], NULL);
    for (int i = 0; i < 7; i++)
        kept_main[i] = calloc(1, 3000);
    kept_main[7] = realloc(malloc(10), 5000);
    lose(888);
    printf("done\n");
    fflush(stdout);
    sigwait(&wanted, &sig);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 50; j++)
            free(kept[i][j]);
    for (int i = 0; i < 8; i++)
        free(kept_main[i]);
    printf("freed\n");
    fflush(stdout);
    for (;;)
        pause();
}
