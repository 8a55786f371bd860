/* A known shape over time (issue 45's fixture): a spike of SPIKE_BLOCKS blocks of 1 MiB
 * (spike_site) freed again, then LEAK blocks of 4,096 bytes kept (leak_site), then churn:
 * CHURN blocks of 32 bytes (churn_site), each freed before the next is made.
 * "spike_leak LEAK" runs and exits; output uses write(2): stdio would allocate. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SPIKE_BLOCKS 40
#define LEAK_BYTES 4096
#define CHURN 100000

void *volatile held[SPIKE_BLOCKS];
void *volatile sink;

__attribute__((noinline)) void *spike_site(void) { return malloc(1 << 20); }
__attribute__((noinline)) void *leak_site(void) { return malloc(LEAK_BYTES); }
__attribute__((noinline)) void *churn_site(void) { return malloc(32); }

int main(int argc, char **argv)
{
    int leaks = argc > 1 ? atoi(argv[1]) : 100;
    for (int i = 0; i < SPIKE_BLOCKS; i++) {
        held[i] = spike_site();
        memset(held[i], 1, 64);
    }
    for (int i = 0; i < SPIKE_BLOCKS; i++)
        free(held[i]);
    for (int i = 0; i < leaks; i++)
        sink = leak_site();
    for (int i = 0; i < CHURN; i++) {
        sink = churn_site();
        free(sink);
    }
    write(1, "done\n", 5);
    return 0;
}
