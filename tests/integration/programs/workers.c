// Processes for the systemwide tests, one per mode; each prints "ready PID" on
// stdout once its shape is in place, then waits for signals:
//   leak         5 x 1000 from leak_site; SIGUSR1 adds 5 more each time
//   churn        a thread frees every block it allocates, forever
//   exit         3 x 300 from exit_site; exits on SIGUSR1 without freeing them
//   fork         2 x 200 from before_fork, then a child that frees one of them and
//                makes 1 x 2000 from in_child (both print ready)
//   exec         4 x 400 from before_exec, then execs itself as after_exec
//   after_exec   1 x 4444 from after_exec_site
//   sizes        one block of each size from 1 to 1000 (1000 groups: reports of ~300 KB)
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t steps;
static void *keep[64];
static int kept;

static void on_usr1(int sig) { (void)sig; steps++; }

static void ready(void)
{
    printf("ready %d\n", getpid());
    fflush(stdout);
}

__attribute__((noinline)) static void *leak_site(size_t n) { return malloc(n); }
__attribute__((noinline)) static void *exit_site(size_t n) { return malloc(n); }
__attribute__((noinline)) static void *before_fork(size_t n) { return malloc(n); }
__attribute__((noinline)) static void *in_child(size_t n) { return malloc(n); }
__attribute__((noinline)) static void *before_exec(size_t n) { return malloc(n); }
__attribute__((noinline)) static void *after_exec_site(size_t n) { return malloc(n); }

static void *churn(void *arg)
{
    (void)arg;
    for (;;) {
        for (int i = 0; i < 100; i++)
            free(malloc(64));
        usleep(1000);
    }
    return NULL;
}

static void wait_forever(void)
{
    for (;;)
        pause();
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    signal(SIGUSR1, on_usr1);
    if (!strcmp(mode, "leak")) {
        int done = -1;
        for (;;) {
            if (done != steps) {
                done = steps;
                for (int i = 0; i < 5; i++)
                    keep[kept++ % 64] = leak_site(1000);
                ready();
            }
            usleep(10000);   // not pause(): a signal between the test and the wait would be lost
        }
    } else if (!strcmp(mode, "churn")) {
        pthread_t t;
        pthread_create(&t, NULL, churn, NULL);
        ready();
        wait_forever();
    } else if (!strcmp(mode, "exit")) {
        for (int i = 0; i < 3; i++)
            keep[kept++] = exit_site(300);
        ready();
        while (!steps)
            usleep(10000);
        _exit(0);
    } else if (!strcmp(mode, "fork")) {
        keep[0] = before_fork(200);
        keep[1] = before_fork(200);
        fflush(stdout);
        if (fork() == 0) {
            free(keep[1]);
            keep[2] = in_child(2000);
        }
        ready();
        wait_forever();
    } else if (!strcmp(mode, "exec")) {
        for (int i = 0; i < 4; i++)
            keep[kept++] = before_exec(400);
        execl(argv[0], argv[0], "after_exec", (char *)NULL);
        return 127;
    } else if (!strcmp(mode, "sizes")) {
        for (size_t size = 1; size <= 1000; size++)
            leak_site(size);
        ready();
        wait_forever();
    } else if (!strcmp(mode, "after_exec")) {
        keep[0] = after_exec_site(4444);
        ready();
        wait_forever();
    }
    fprintf(stderr, "usage: workers leak|churn|exit|fork|exec\n");
    return 2;
}
