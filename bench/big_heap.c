/* big_heap N SIZE READY_FILE: N blocks of SIZE bytes in chains of 100 (each block
 * points to the next); a global array holds the head of each chain, except every
 * 100th chain, which is dropped: 1% of the blocks unreachable. Writes its pid to
 * READY_FILE when done, then sleeps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void **heads;

int main(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    long n = atol(argv[1]), size = atol(argv[2]), chains = (n + 99) / 100;
    heads = calloc(chains, sizeof *heads);
    for (long c = 0; c < chains; c++) {
        void **next = NULL;
        for (long i = 0; i < 100 && c * 100 + i < n; i++) {
            void **block = malloc(size);
            memset(block, 0x5a, size);
            block[0] = next;
            next = block;
        }
        heads[c] = c % 100 == 99 ? NULL : next;
    }
    FILE *ready = fopen(argv[3], "w");
    fprintf(ready, "%d\n", getpid());
    fclose(ready);
    sleep(3600);
    return 0;
}
