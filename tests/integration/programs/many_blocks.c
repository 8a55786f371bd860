// Holds a heap to be read, frozen and copied while it dies: argv[1] blocks of 16-79 bytes
// from three call sites, kept; then "ready" on stdout, and argv[2] seconds without an
// allocator call (0: until killed; -1: none) before a normal exit.
// With "forks" as argv[3]: then 40 children, each making one block of 4000 and leaving after
// 0-20 ms (some at once, some killed by SIGKILL from within), while the parent waits.
// With a number as argv[3]: also that many MiB in one block of zeros (a heap that takes a
// while to copy).
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline)) static void *site_a(size_t n) { return malloc(n); }
__attribute__((noinline)) static void *site_b(size_t n) { return malloc(n); }
__attribute__((noinline)) static void *site_c(size_t n) { return malloc(n); }

void *volatile own;

static void children(void)
{
    for (int i = 0; i < 40; i++) {
        pid_t child = fork();
        if (child == 0) {
            own = malloc(4000);
            usleep((useconds_t)(rand() % 20000));
            if (i % 3 == 0)
                kill(getpid(), SIGKILL);
            _exit(0);
        }
        srand((unsigned)child);
    }
    while (wait(NULL) > 0)
        ;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000;
    void **keep = malloc(sizeof(void *) * (size_t)n);
    for (long i = 0; i < n; i++) {
        size_t size = 16 + (size_t)(i % 64);
        keep[i] = i % 3 == 0 ? site_a(size) : i % 3 == 1 ? site_b(size) : site_c(size);
    }
    if (argc > 3 && !strcmp(argv[3], "forks"))
        children();
    else if (argc > 3)
        memset(site_a((size_t)atol(argv[3]) << 20), 0, (size_t)atol(argv[3]) << 20);
    printf("ready\n");
    fflush(stdout);
    long seconds = argc > 2 ? atol(argv[2]) : 0;
    if (seconds < 0)
        return 0;
    time_t end = time(NULL) + seconds;
    while (!seconds || time(NULL) < end)
        sleep(1);
    return 0;
}
