// Records a stack for the BPF walk's replay (test_walk_replay.py): built -O2 without frame
// pointers, it reaches record() through libc (qsort's comparison callback), or through a
// signal handler, and writes what the BPF program has at an allocator's return: the return
// address, the caller's sp and rbp, the stack above sp (to the end of its mapping), and
// libgcc's _Unwind_Backtrace of the same frames as the truth, then /proc/self/maps. Usage: record_stack qsort|signal FILE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unwind.h>

#define MAX_TRUTH 64

static const char *out_path;

struct truth {
    uint64_t pc[MAX_TRUTH];
    uint64_t count;
    int seen;  // record()'s own frame is passed over
};

static _Unwind_Reason_Code take(struct _Unwind_Context *context, void *arg)
{
    struct truth *truth = arg;
    uint64_t pc = _Unwind_GetIP(context);
    if (!truth->seen++)
        return _URC_NO_REASON;
    if (!pc || truth->count >= MAX_TRUTH)
        return _URC_END_OF_STACK;
    truth->pc[truth->count++] = pc;
    return _URC_NO_REASON;
}

// The end of the mapping that holds address, from /proc/self/maps.
static uint64_t mapping_end(uint64_t address)
{
    FILE *maps = fopen("/proc/self/maps", "r");
    unsigned long start, end;
    char line[512];
    uint64_t found = 0;
    while (maps && fgets(line, sizeof line, maps))
        if (sscanf(line, "%lx-%lx", &start, &end) == 2 && address >= start && address < end)
            found = end;
    if (maps)
        fclose(maps);
    return found;
}

__attribute__((noinline)) static void record(void)
{
    uint64_t *frame = __builtin_frame_address(0);  // record's own rbp: [0] the caller's, [1] the return address
    uint64_t head[3] = {(uint64_t)__builtin_return_address(0), (uint64_t)(frame + 2), frame[0]};
    struct truth truth = {0};
    _Unwind_Backtrace(take, &truth);
    uint64_t top = mapping_end(head[1]);
    FILE *out = fopen(out_path, "wb");
    uint64_t size = top - head[1];
    if (!out || !top || fwrite(head, sizeof head, 1, out) != 1 || fwrite(&truth.count, 8, 1, out) != 1 ||
        fwrite(truth.pc, 8, truth.count, out) != truth.count || fwrite(&size, 8, 1, out) != 1 ||
        fwrite((const void *)head[1], 1, size, out) != size)
        exit(2);
    char text[4096];
    FILE *maps = fopen("/proc/self/maps", "r");
    size_t n;
    while (maps && (n = fread(text, 1, sizeof text, maps)) > 0)  // the maps after the stack, in the same file
        if (fwrite(text, 1, n, out) != n)
            exit(2);
    if (!maps)
        exit(2);
    fclose(maps);
    fclose(out);
}

__attribute__((noinline)) static void inner(int depth)
{
    if (depth > 0)
        inner(depth - 1);
    else
        record();
    __asm__ volatile("");  // not a tail call: each level keeps its frame
}

static int compare(const void *a, const void *b)
{
    static int recorded;
    if (!recorded++)
        inner(3);
    return *(const int *)a - *(const int *)b;
}

static void on_signal(int signal)
{
    (void)signal;
    inner(2);
}

__attribute__((noinline)) static void outer(const char *mode)
{
    if (!strcmp(mode, "signal")) {
        signal(SIGUSR1, on_signal);
        raise(SIGUSR1);
    } else {
        int values[] = {3, 1, 2};
        qsort(values, 3, sizeof *values, compare);
    }
    __asm__ volatile("");
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    out_path = argv[2];
    outer(argv[1]);
    return 0;
}
