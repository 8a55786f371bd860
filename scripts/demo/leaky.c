/* A small service that leaks: a request handler forgets one buffer in ten,
 * a cache grows without bound, and a worker thread churns without leaking.
 * leaky-demo [ROUNDS]: 50 rounds of 0.1 s by default; 0 runs forever, a round a second
 * (the test VM's service). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct entry {
    struct entry *next;
    char key[40];
};
static struct entry *cache;
static char *volatile last_response; /* volatile: -O2 may not drop the calls */

__attribute__((noinline)) static void cache_insert(int i)
{
    struct entry *e = malloc(sizeof *e);
    memset(e->key, 'a' + i % 26, sizeof e->key);
    e->next = cache;
    cache = e;
}

__attribute__((noinline)) static char *render_response(int i)
{
    char *body = malloc(512);
    memset(body, 'x', 512);
    if (i % 10 == 3)
        return body; /* leaked: the caller forgets it */
    free(body);
    return NULL;
}

static void *worker(void *arg)
{
    (void)arg;
    for (int i = 0; i < 300000; i++) {
        void *volatile block = malloc(64 + i % 256);
        free(block);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 50;
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    for (int i = 0; rounds == 0 || i < rounds; i++) {
        for (int j = 0; j < 10; j++) {
            last_response = render_response(i * 10 + j);
            cache_insert(j);
        }
        usleep(rounds ? 100000 : 1000000); /* as a service: ~0.5 KB/s, so the VM lasts */
    }
    pthread_join(t, NULL);
    return 0;
}
