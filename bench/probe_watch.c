/* probe_watch: tells from inside when a tracer's probes go live and when they go.
 * Every millisecond it times malloc and free, four times each, and keeps the fastest
 * of each: an untraced call takes tens of ns, a call that hits a uprobe microseconds,
 * and the fastest of four is not fooled by an interrupt. Two samples in a row with
 * both slow print "traced NS" (CLOCK_MONOTONIC, the clock of Python's
 * time.monotonic_ns), so a bench can time "command to probes live": free is the last
 * probe either tool attaches (memleak attaches malloc first and free near the end).
 * 20 samples with both fast print "untraced NS" (probes go one by one as a tracer exits). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define SLOW_NS 300
#define TIMINGS 4

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* 2: malloc and free both slow, 0: both fast, 1: one of each. */
static int slow_calls(void)
{
    int64_t malloc_ns = INT64_MAX, free_ns = INT64_MAX;
    for (int i = 0; i < TIMINGS; i++) {
        int64_t start = now_ns();
        void *volatile block = malloc(64);
        int64_t allocated = now_ns();
        free(block);
        int64_t freed = now_ns();
        if (allocated - start < malloc_ns)
            malloc_ns = allocated - start;
        if (freed - allocated < free_ns)
            free_ns = freed - allocated;
    }
    return (malloc_ns > SLOW_NS) + (free_ns > SLOW_NS);
}

int main(void)
{
    int traced = 0, streak = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (;;) {
        int slow = slow_calls();
        int other_way = traced ? slow == 0 : slow == 2;
        streak = other_way ? streak + 1 : 0;
        if (streak == (traced ? 20 : 2)) {
            traced = !traced;
            streak = 0;
            printf("%s %lld\n", traced ? "traced" : "untraced", (long long)now_ns());
        }
        usleep(1000);
    }
}
