// cfi.c under AddressSanitizer and UndefinedBehaviorSanitizer: the rows of an .eh_frame section
// (a file of its bytes) and of damaged copies of it, each copy in a buffer of exactly its size so
// that a read one byte past it is caught; then the in-process rule of a few of this program's
// own pcs. Usage: cfi_damage SECTION_FILE ADDRESS SEED COPIES. Exit 0 when nothing was caught.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cfi.h"

#define MAX_ROWS 2000000

static unsigned long long rng_state;

static unsigned long long next_random(void)  // xorshift64*: seeded, so a failure can be run again
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ULL;
}

static long rows_of(const uint8_t *bytes, size_t size, uint64_t address, struct cfi_section_row *rows)
{
    uint8_t *exact = malloc(size ? size : 1);
    if (!exact)
        exit(2);
    memcpy(exact, bytes, size);
    long found = cfi_section_rows(exact, size, address, rows, MAX_ROWS);
    free(exact);
    return found;
}

int main(int argc, char **argv)
{
    if (argc != 5)
        return 2;
    FILE *file = fopen(argv[1], "rb");
    if (!file)
        return 2;
    static uint8_t section[64 << 20];
    size_t size = fread(section, 1, sizeof section, file);
    fclose(file);
    uint64_t address = strtoull(argv[2], NULL, 16);
    rng_state = strtoull(argv[3], NULL, 10) | 1;
    long copies = strtol(argv[4], NULL, 10);
    struct cfi_section_row *rows = malloc(MAX_ROWS * sizeof *rows);
    uint8_t *damaged = malloc(size);
    if (!rows || !damaged)
        return 2;
    long whole = rows_of(section, size, address, rows);
    if (whole <= 0) {
        fprintf(stderr, "no rows in the undamaged section\n");
        return 1;
    }
    for (long i = 0; i < copies; i++) {
        memcpy(damaged, section, size);
        for (int changes = 1 + next_random() % 8; changes > 0; changes--)
            damaged[next_random() % size] = (uint8_t)next_random();
        size_t cut = next_random() % 10 < 3 ? next_random() % (size + 1) : size;
        rows_of(damaged, cut, address, rows);
    }
    struct unwind_row rule;
    uintptr_t own[] = {(uintptr_t)main, (uintptr_t)rows_of, (uintptr_t)next_random, (uintptr_t)main + 40};
    for (size_t i = 0; i < sizeof own / sizeof *own; i++)
        if (cfi_usable() && !cfi_rule_at(own[i], &rule)) {
            fprintf(stderr, "no rule at %#lx\n", (unsigned long)own[i]);
            return 1;
        }
    free(damaged);
    free(rows);
    printf("rows %ld, damaged copies %ld\n", whole, copies);
    return 0;
}
