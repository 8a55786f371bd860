// waits KIND [SECONDS]: the main thread blocks in one system call (KIND: read, epoll, poll,
// sigwait, condwait, sleep) until stdin gives a byte or SIGUSR1 comes (sleep: for SECONDS), then
// prints what the call returned and exits 0 only if the wait ended as untraced: no EINTR, no
// sleep longer than asked. A helper thread, blocked in read, wakes condwait's condition.
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t woken = PTHREAD_COND_INITIALIZER;
static int byte_came;

static void *wake_on_stdin(void *unused) {
    char byte;
    (void)unused;
    while (read(0, &byte, 1) < 0 && errno == EINTR) {
    }
    pthread_mutex_lock(&lock);
    byte_came = 1;
    pthread_cond_signal(&woken);
    pthread_mutex_unlock(&lock);
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int done(const char *kind, long result) {
    int failed = result < 0;
    printf("%s returned %ld%s%s\n", kind, result, failed ? ": " : "", failed ? strerror(errno) : "");
    fflush(stdout);
    return failed;
}

int main(int argc, char **argv) {
    const char *kind = argc > 1 ? argv[1] : "read";
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, &usr1, NULL);
    pthread_t helper;
    if (strcmp(kind, "condwait") == 0)
        pthread_create(&helper, NULL, wake_on_stdin, NULL);
    int epoll = epoll_create1(0);
    struct epoll_event event = {.events = EPOLLIN};
    epoll_ctl(epoll, EPOLL_CTL_ADD, 0, &event);
    printf("ready\n");
    fflush(stdout);
    char byte;
    if (strcmp(kind, "read") == 0)
        return done(kind, read(0, &byte, 1));
    if (strcmp(kind, "epoll") == 0)
        return done(kind, epoll_wait(epoll, &event, 1, -1));
    if (strcmp(kind, "poll") == 0) {
        struct pollfd in = {.fd = 0, .events = POLLIN};
        return done(kind, poll(&in, 1, -1));
    }
    if (strcmp(kind, "sigwait") == 0)
        return done(kind, sigtimedwait(&usr1, NULL, NULL));
    if (strcmp(kind, "condwait") == 0) {
        pthread_mutex_lock(&lock);
        while (!byte_came)
            pthread_cond_wait(&woken, &lock);
        pthread_mutex_unlock(&lock);
        return done(kind, 0);
    }
    if (strcmp(kind, "sleep") == 0) {
        double asked = argc > 2 ? atof(argv[2]) : 1, started = now();
        struct timespec request = {(time_t)asked, (long)((asked - (time_t)asked) * 1e9)};
        int result = nanosleep(&request, NULL);
        printf("slept %.3f of %.3f\n", now() - started, asked);
        return done(kind, result);
    }
    return 2;
}
