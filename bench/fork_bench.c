/* fork_bench LIVE FORKS
 * Holds LIVE blocks, then forks FORKS children one after the other, each exiting at once,
 * and waits for each. Prints "forks N elapsed_ns T" for the forks only. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: fork_bench LIVE FORKS\n");
        return 2;
    }
    long live = atol(argv[1]), forks = atol(argv[2]);
    void **keep = malloc(sizeof(void *) * (size_t)(live + 1));
    for (long i = 0; i < live; i++)
        keep[i] = malloc(64);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < forks; i++) {
        pid_t child = fork();
        if (child == 0)
            _exit(0);
        waitpid(child, NULL, 0);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("forks %ld elapsed_ns %lld\n", forks,
           (long long)(b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec));
    return 0;
}
