// main_exited: two workers wait for a byte each on stdin, then keep 50 blocks of 300 + their
// index bytes made in keep(); main calls pthread_exit as soon as they run, so the process
// lives on with its first thread a zombie. The last worker done prints "done".
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int finished;

__attribute__((noinline)) static void keep(long size)
{
    for (int i = 0; i < 50; i++) {
        void *volatile block = malloc(size);
        (void)block;
    }
}

static void *work(void *index)
{
    char byte;
    if (read(0, &byte, 1) != 1)
        return NULL;
    keep(300 + (long)index);
    if (__atomic_add_fetch(&finished, 1, __ATOMIC_SEQ_CST) == 2) {
        puts("done");
        fflush(stdout);
    }
    for (;;)
        pause();
}

int main(void)
{
    pthread_t workers[2];
    for (long i = 0; i < 2; i++)
        pthread_create(&workers[i], NULL, work, (void *)i);
    puts("ready");
    fflush(stdout);
    pthread_exit(NULL);
}
