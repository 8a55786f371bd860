/* churn SECONDS [PARALLEL]
 * Starts short processes as fast as it can for SECONDS: each forks, execs itself as a
 * child that makes a few blocks and exits, PARALLEL at a time. Prints "processes N
 * elapsed_ns T". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void *volatile sink;

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "child")) {
        for (int i = 0; i < 4; i++)
            sink = malloc(100 + i);
        return 0;
    }
    double seconds = argc > 1 ? atof(argv[1]) : 10;
    int parallel = argc > 2 ? atoi(argv[2]) : 4;
    struct timespec a, now;
    clock_gettime(CLOCK_MONOTONIC, &a);
    long started = 0;
    int running = 0;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        double elapsed = (now.tv_sec - a.tv_sec) + (now.tv_nsec - a.tv_nsec) / 1e9;
        if (elapsed >= seconds)
            break;
        while (running < parallel) {
            pid_t child = fork();
            if (child == 0) {
                execl(argv[0], argv[0], "child", (char *)NULL);
                _exit(127);
            }
            running++;
            started++;
        }
        if (wait(NULL) > 0)
            running--;
    }
    while (wait(NULL) > 0)
        ;
    clock_gettime(CLOCK_MONOTONIC, &now);
    printf("processes %ld elapsed_ns %lld\n", started,
           (long long)(now.tv_sec - a.tv_sec) * 1000000000LL + (now.tv_nsec - a.tv_nsec));
    return 0;
}
