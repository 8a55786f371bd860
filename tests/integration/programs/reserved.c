// Reserves argv[1] GiB of writable memory it never touches (as ASan's shadow and some
// runtimes' heaps do: MAP_NORESERVE), makes five blocks of 4321 bytes, says "ready", waits.
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

void *volatile kept[5];

int main(int argc, char **argv)
{
    size_t size = (size_t)atol(argc > 1 ? argv[1] : "1024") << 30;
    if (mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) == MAP_FAILED)
        return 1;
    for (int i = 0; i < 5; i++)
        kept[i] = malloc(4321);
    printf("ready\n");
    fflush(stdout);
    for (;;)
        pause();
}
