// The BPF program's stack walk (unwind/walk.bpf.h) built for user space, to replay it on a
// recorded stack (test_walk_replay.py) without root: the maps become arrays, and reads of
// the target's memory come from the recorded copy of its stack (any other read fails, as
// bpf_probe_read_user of an unmapped address would).
#include <stdint.h>
#include <string.h>

#ifndef __always_inline  // glibc's sys/cdefs.h has it
#define __always_inline inline __attribute__((always_inline))
#endif
#ifndef STACK_DEPTH
#define STACK_DEPTH 64
#endif
#define PAGE_BYTES 4096
#define UNWIND_DWARF 1

#include "arch.h"
#include "cfi.h"  // the fixed-width types the headers are written in, and rows.h
#include "layout.h"
#include "walk_state.h"

struct pending_call {  // the members the walk uses, as leaktrace.bpf.c has them
    struct {
        struct stack_val walk;
    } stack;
    struct walk_state walk;
    u8 stack_copy[STACK_COPY];
};

static const struct unwind_row *row_table;
static u32 row_total;
static const u64 *page_table;
static u32 page_total;

static struct unwind_row *row_at(const u32 *index)
{
    return *index < row_total ? (struct unwind_row *)&row_table[*index] : 0;
}

static u64 *page_at(const u32 *index)
{
    return *index < page_total ? (u64 *)&page_table[*index] : 0;
}

static const struct {
    struct unwind_row *(*lookup)(const u32 *);
} unwind_rows = {row_at};
static const struct {
    u64 *(*lookup)(const u32 *);
} unwind_pages = {page_at};

static const u8 *memory;
static u64 memory_start, memory_size;

static long read_user(void *dst, u32 size, const void *address)
{
    u64 at = (u64)address;
    if (at < memory_start || at - memory_start > memory_size || size > memory_size - (at - memory_start)) {
        memset(dst, 0, size);
        return -14;  // -EFAULT
    }
    memcpy(dst, memory + (at - memory_start), size);
    return 0;
}

#include "walk.bpf.h"

// Walks from (pc, sp, bp) as the BPF program does from an allocator's return; frames get the
// return addresses, why the counter of a truncation (0: the walk ended where it should).
u32 walk_replay(const struct exec_maps *maps, const struct unwind_row *rows, u32 rows_count, const u64 *pages,
                u32 pages_count, const u8 *stack, u64 stack_start, u64 stack_size, u64 pc, u64 sp, u64 bp, u64 *frames,
                u32 *why)
{
    static struct pending_call call;
    row_table = rows, row_total = rows_count, page_table = pages, page_total = pages_count;
    memory = stack, memory_start = stack_start, memory_size = stack_size;
    memset(&call, 0, sizeof call);
    struct walk_state *w = &call.walk;
    w->pc = pc, w->sp = sp, w->bp = bp, w->end = WALK_ON;
    w->copy_base = sp;
    w->copied = copy_window(&call, sp);
    while (w->end == WALK_ON)
        unwind_one(&call, (struct exec_maps *)maps);
    *why = w->end == WALK_TRUNCATED ? w->why : 0;
    memcpy(frames, call.stack.walk.ip, w->depth * sizeof *frames);
    return w->depth;
}
