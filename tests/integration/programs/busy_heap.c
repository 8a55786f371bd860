// busy_heap BLOCKS THREADS MILLISECONDS [main-exits]: keeps BLOCKS blocks of 16-79 bytes from
// kept_block, prints "ready", then THREADS threads allocate and free without pause, each
// ending after a few hundred calls and replaced by a new one (threads exit all the time),
// until MILLISECONDS have passed (0: until killed); then the process exits with status 0.
// With "main-exits", the main thread calls pthread_exit once the workers run, and the
// process lives on in them (and ends when the time is up).
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void *volatile *kept;
static long deadline_ms;

static long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

__attribute__((noinline)) static void *kept_block(size_t n) { return malloc(n); }

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(long)arg;
    for (;;) {
        for (int i = 0; i < 300; i++) {
            void *p = malloc(16 + rand_r(&seed) % 200);
            free(realloc(p, 32 + rand_r(&seed) % 300));
        }
        if (deadline_ms && now_ms() >= deadline_ms)
            exit(0);
        pthread_t next;  // a new thread goes on, this one ends
        if (pthread_create(&next, NULL, worker, (void *)(long)rand_r(&seed)) == 0) {
            pthread_detach(next);
            return NULL;
        }
    }
}

int main(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    long blocks = atol(argv[1]), threads = atol(argv[2]), ms = atol(argv[3]);
    kept = malloc(sizeof(void *) * (size_t)(blocks ? blocks : 1));
    for (long i = 0; i < blocks; i++) kept[i] = kept_block(16 + (size_t)(i % 64));
    deadline_ms = ms ? now_ms() + ms : 0;
    printf("ready\n");
    fflush(stdout);
    for (long i = 0; i < threads; i++) {
        pthread_t id;
        pthread_create(&id, NULL, worker, (void *)(i + 1));
        pthread_detach(id);
    }
    if (argc > 4 && strcmp(argv[4], "main-exits") == 0)
        pthread_exit(NULL);
    for (;;) {
        if (deadline_ms && now_ms() >= deadline_ms)
            return 0;
        usleep(1000);
    }
}
