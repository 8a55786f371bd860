// known_heap COUNT SIZE: says "ready", waits for SIGUSR1, then keeps COUNT blocks of SIZE
// bytes made by grow() (one thread, nothing else allocated), says "done" and waits.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void *volatile *kept;

__attribute__((noinline)) static void grow(long count, long size)
{
    for (long i = 0; i < count; i++)
        kept[i] = malloc(size);
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    long count = atol(argv[1]), size = atol(argv[2]);
    kept = calloc(count, sizeof *kept);
    sigset_t wanted;
    sigemptyset(&wanted);
    sigaddset(&wanted, SIGUSR1);
    sigprocmask(SIG_BLOCK, &wanted, NULL);
    printf("ready\n");
    fflush(stdout);
    int sig;
    sigwait(&wanted, &sig);
    grow(count, size);
    printf("done\n");
    fflush(stdout);
    for (;;)
        pause();
}
