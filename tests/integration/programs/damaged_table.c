// Run with leaktrace's preload library: makes five blocks of 4321 bytes, then damages the
// library's exported table (its shards) as MODE says (as any program could: the symbols are exported),
// says "ready" and waits argv[2] seconds without an allocator call, then _exits (no exit dump).
//   huge_slots, max_slots, null_table, kernel_table, locked, wild_frames,
//   huge_frame_count, huge_size, fake_million
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../../src/leaktrace/abi/record.h"  // the table as the library lays it out

void *volatile kept[5];

// The shard holding the first of the blocks of 4321 bytes, and that block's record.
static struct table_shard *shard_of_first(struct table_shard *shards, struct record **live)
{
    for (int s = 0; s < TABLE_SHARDS; s++)
        for (size_t i = 0; i < shards[s].slots; i++)
            if (shards[s].records[i].pointer > 1 && shards[s].records[i].size == 4321) {
                *live = &shards[s].records[i];
                return &shards[s];
            }
    return NULL;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    for (int i = 0; i < 5; i++)
        kept[i] = malloc(4321);
    struct table_shard *shards = dlsym(RTLD_DEFAULT, "leaktrace_shards");
    struct record *fake = NULL, *live = NULL;
    if (!shards)
        return 2;
    if (!strcmp(mode, "fake_million")) {
        size_t count = 1 << 20;
        fake = calloc(count, sizeof(*fake));
        for (size_t i = 0; i < count; i++)
            fake[i].pointer = 0x10000 + 16 * i, fake[i].size = 8;
    }
    struct table_shard *shard = shard_of_first(shards, &live);
    if (!shard)
        return 2;
    if (!strcmp(mode, "huge_slots"))
        shard->slots = (size_t)1 << 40;
    else if (!strcmp(mode, "max_slots"))
        shard->slots = SIZE_MAX;
    else if (!strcmp(mode, "null_table"))
        shard->records = NULL;
    else if (!strcmp(mode, "kernel_table"))
        shard->records = (struct record *)0xffff888000000000ULL;
    else if (!strcmp(mode, "locked"))
        __atomic_store_n(&shard->lock, 1, __ATOMIC_RELEASE);  // held, as by a thread stopped inside the library
    else if (!strcmp(mode, "wild_frames"))
        live->frames = (uintptr_t *)0xdead0000000ULL;
    else if (!strcmp(mode, "huge_frame_count"))
        live->frame_count = 1u << 31;
    else if (!strcmp(mode, "huge_size"))
        live->size = (size_t)1 << 62;
    else if (!strcmp(mode, "fake_million"))
        for (int s = 0; s < TABLE_SHARDS; s++)  // one shard of a million records, the others empty
            shards[s].records = s ? NULL : fake, shards[s].slots = s ? 0 : 1 << 20;
    write(1, "ready\n", 6);
    time_t end = time(NULL) + (argc > 2 ? atoi(argv[2]) : 1);
    while (time(NULL) < end)
        sleep(1);
    _exit(0);
}
