// threads_churn COUNTER_FILE: starts and joins short-lived threads forever, two at a
// time, and counts them in the first 8 bytes of COUNTER_FILE (shared, so a test can
// see whether it is running). Prints "ready" once the count is set up.
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static void *brief(void *arg)
{
    free(malloc(64));
    return arg;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    int fd = open(argv[1], O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, 8) != 0)
        return 1;
    volatile uint64_t *count = mmap(NULL, 8, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        pthread_t a, b;
        pthread_create(&a, NULL, brief, NULL);
        pthread_create(&b, NULL, brief, NULL);
        pthread_join(a, NULL);
        pthread_join(b, NULL);
        *count += 2;
    }
}
