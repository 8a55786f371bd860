// Run with leaktrace's preload library: makes five blocks of 4321 bytes, then damages the
// library's exported table as MODE says (as any program could: the symbols are exported),
// says "ready" and waits argv[2] seconds without an allocator call, then _exits (no exit dump).
//   huge_slots, max_slots, null_table, kernel_table, locked, wild_frames,
//   huge_frame_count, huge_size, fake_million
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct record {   // src/leaktrace/sources/preload/native/malloc_debug.h
    uintptr_t pointer;
    size_t size;
    uint32_t flags;
    uint32_t frame_count;
    uintptr_t *frames;
};

void *volatile kept[5];

static struct record *first_live(struct record *table, size_t slots)
{
    for (size_t i = 0; i < slots; i++)
        if (table[i].pointer > 1 && table[i].size == 4321)
            return &table[i];
    return NULL;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    for (int i = 0; i < 5; i++)
        kept[i] = malloc(4321);
    struct record **table = dlsym(RTLD_DEFAULT, "leaktrace_table");
    size_t *slots = dlsym(RTLD_DEFAULT, "leaktrace_table_slots");
    pthread_mutex_t *lock = dlsym(RTLD_DEFAULT, "leaktrace_table_lock");
    struct record *fake = NULL;
    if (!table || !slots || !lock)
        return 2;
    if (!strcmp(mode, "fake_million")) {
        size_t count = 1 << 20;
        fake = calloc(count, sizeof(*fake));
        for (size_t i = 0; i < count; i++)
            fake[i].pointer = 0x10000 + 16 * i, fake[i].size = 8;
    }
    struct record *live = first_live(*table, *slots);
    if (!strcmp(mode, "huge_slots"))
        *slots = (size_t)1 << 40;
    else if (!strcmp(mode, "max_slots"))
        *slots = SIZE_MAX;
    else if (!strcmp(mode, "null_table"))
        *table = NULL;
    else if (!strcmp(mode, "kernel_table"))
        *table = (struct record *)0xffff888000000000ULL;
    else if (!strcmp(mode, "locked"))
        pthread_mutex_lock(lock);
    else if (!strcmp(mode, "wild_frames") && live)
        live->frames = (uintptr_t *)0xdead0000000ULL;
    else if (!strcmp(mode, "huge_frame_count") && live)
        live->frame_count = 1u << 31;
    else if (!strcmp(mode, "huge_size") && live)
        live->size = (size_t)1 << 62;
    else if (!strcmp(mode, "fake_million"))
        *table = fake, *slots = 1 << 20;
    write(1, "ready\n", 6);
    time_t end = time(NULL) + (argc > 2 ? atoi(argv[2]) : 1);
    while (time(NULL) < end)
        sleep(1);
    _exit(0);
}
