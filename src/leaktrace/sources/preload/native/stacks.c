// Stacks (no frame pointers needed) and their lines in the log. The walk follows each frame
// by the rule cfi.c works out from .eh_frame, cached by pc; a frame it cannot follow has the
// whole stack taken again by libgcc's _Unwind_Backtrace, which gives the same frames.
#include "malloc_debug.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ucontext.h>
#include <unistd.h>
#include <unwind.h>

#include "cfi.h"

static uintptr_t own_start, own_end;  // this library's code: its frames are left out

static int find_in_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    uintptr_t here = (uintptr_t)data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X) && here >= start && here < start + ph->p_memsz) {
            own_start = start;
            own_end = start + ph->p_memsz;
            return 1;
        }
    }
    return 0;
}

void find_own_code(void)
{
    dl_iterate_phdr(find_in_object, (void *)(uintptr_t)find_own_code);
}

// Records a return address as both walks do: none while still inside this library, then
// each one moved into its call instruction, as bionic adjusts it on x86.
static void record_frame(uintptr_t *frames, size_t *count, uintptr_t pc)
{
    if (*count == 0 && pc >= own_start && pc < own_end)
        return;
    frames[(*count)++] = pc >= 4096 ? pc - 1 : pc;
}

struct unwind_state {
    uintptr_t *frames;
    size_t count, max;
};

static _Unwind_Reason_Code take_frame(struct _Unwind_Context *context, void *arg)
{
    struct unwind_state *state = arg;
    uintptr_t pc = _Unwind_GetIP(context);
    if (!pc)
        return _URC_END_OF_STACK;
    record_frame(state->frames, &state->count, pc);
    return state->count >= state->max ? _URC_END_OF_STACK : _URC_NO_REASON;
}

static size_t libgcc_stack(uintptr_t *frames, size_t max)
{
    struct unwind_state state = {frames, 0, max};
    _Unwind_Backtrace(take_frame, &state);
    return state.count;
}

// Rules by pc, one word each so that threads share them without a lock: the pc's bits above
// RULE_INDEX_BITS, the CFA rule + 1 (0: empty), the CFA offset, rbp saved, rbp's offset / 8.
#define RULE_INDEX_BITS 14
#define RULE_TAG_SHIFT 31
#define RULE_KIND_SHIFT 28
#define RULE_OFFSET_SHIFT 8
#define RULE_OFFSET_LIMIT (1 << 20)
#define RBP_SAVED_BIT 0x80
static uint64_t rule_cache[1 << RULE_INDEX_BITS];

static uint64_t packed_rule(uintptr_t pc, const struct unwind_row *row)
{
    int saved = row->rbp_rule == RBP_SAVED;
    if (pc >> 47 || row->cfa_offset < 0 || row->cfa_offset >= RULE_OFFSET_LIMIT ||
        (saved && (row->rbp_offset % 8 || row->rbp_offset < -512 || row->rbp_offset > 504)))
        return 0;  // not kept: worked out again next time
    return ((uint64_t)(pc >> RULE_INDEX_BITS) << RULE_TAG_SHIFT) | ((uint64_t)(row->cfa_rule + 1) << RULE_KIND_SHIFT) |
           ((uint64_t)row->cfa_offset << RULE_OFFSET_SHIFT) |
           (saved ? RBP_SAVED_BIT | (row->rbp_offset / 8 & 0x7f) : 0);
}

// A rule as the walk uses it, decoded from a cache word into values the compiler keeps in
// registers (a struct unwind_row, which cfi_rule_at fills through a pointer, would live in memory).
struct rule {
    int cfa_rule;  // CFA_*
    long cfa_offset;
    int rbp_saved;  // rbp's value is at CFA + rbp_offset
    long rbp_offset;
};

// The rule at pc: 0 if no FDE covers it.
static inline __attribute__((always_inline)) int rule_at(uintptr_t pc, struct rule *rule)
{
    uint64_t *slot = &rule_cache[pc & ((1u << RULE_INDEX_BITS) - 1)];
    uint64_t word = __atomic_load_n(slot, __ATOMIC_RELAXED);
    if (!word || word >> RULE_TAG_SHIFT != pc >> RULE_INDEX_BITS) {
        struct unwind_row row;
        if (!cfi_rule_at(pc, &row))
            return 0;
        word = packed_rule(pc, &row);
        if (!word) {  // not kept: used as it is
            *rule = (struct rule){row.cfa_rule, row.cfa_offset, row.rbp_rule == RBP_SAVED, row.rbp_offset};
            return 1;
        }
        __atomic_store_n(slot, word, __ATOMIC_RELAXED);
    }
    int8_t rbp_eighths = (int8_t)((word & 0x7f) << 1) >> 1;
    *rule = (struct rule){(int)(word >> RULE_KIND_SHIFT & 7) - 1,
                          (long)(word >> RULE_OFFSET_SHIFT & (RULE_OFFSET_LIMIT - 1)), (word & RBP_SAVED_BIT) != 0,
                          rbp_eighths * 8L};
    return 1;
}

// Code unloaded, and perhaps other code loaded at its addresses: no rule of it is kept.
static void forget_rules(void)
{
    for (size_t i = 0; i < sizeof rule_cache / sizeof *rule_cache; i++)
        __atomic_store_n(&rule_cache[i], 0, __ATOMIC_RELAXED);
}

EXPORT int dlclose(void *handle)
{
    static int (*next_dlclose)(void *);
    if (!next_dlclose)
        next_dlclose = (int (*)(void *))dlsym(RTLD_NEXT, "dlclose");
    int result = next_dlclose(handle);
    forget_rules();
    return result;
}

static unsigned long libgcc_walks;  // stacks with a frame the rules could not follow
static int libgcc_only;             // LEAKTRACE_UNWINDER=libgcc

void choose_unwinder(void)
{
    const char *unwinder = getenv("LEAKTRACE_UNWINDER");
    libgcc_only = (unwinder && !strcmp(unwinder, "libgcc")) || !cfi_usable();
}

unsigned long stacks_walked_by_libgcc(void)
{
    return __atomic_load_n(&libgcc_walks, __ATOMIC_RELAXED);
}

// The frames above this call, recorded as take_frame records them; -1 at a frame the rules
// cannot follow.
__attribute__((noinline)) static long rule_stack(uintptr_t *frames, size_t max)
{
    uintptr_t pc, sp, bp;
    __asm__ volatile("lea 0(%%rip), %0\n\tmov %%rsp, %1\n\tmov %%rbp, %2" : "=r"(pc), "=r"(sp), "=r"(bp));
    size_t count = 0;
    int exact = 1;  // pc is where execution is, not a return address (a signal interrupted it)
    while (count < max) {
        struct rule rule;
        if (!rule_at(exact ? pc : pc - 1, &rule))
            return (long)count;  // no FDE: libgcc's walk ends here too
        uintptr_t caller_pc, caller_sp, caller_bp = bp;
        if (rule.cfa_rule == CFA_END) {
            return (long)count;
        } else if (rule.cfa_rule == CFA_SIGNAL) {
            const greg_t *registers = ((const ucontext_t *)sp)->uc_mcontext.gregs;
            caller_pc = (uintptr_t)registers[REG_RIP];
            caller_sp = (uintptr_t)registers[REG_RSP];
            caller_bp = (uintptr_t)registers[REG_RBP];
            exact = 1;
        } else if (rule.cfa_rule == CFA_RSP || rule.cfa_rule == CFA_RBP) {
            uintptr_t cfa = (rule.cfa_rule == CFA_RSP ? sp : bp) + (uintptr_t)rule.cfa_offset;
            if (cfa <= sp)
                return -1;  // the stack would not shrink
            memcpy(&caller_pc, (const void *)(cfa - 8), sizeof caller_pc);
            if (rule.rbp_saved)
                memcpy(&caller_bp, (const void *)(cfa + rule.rbp_offset), sizeof caller_bp);
            caller_sp = cfa;
            exact = 0;
        } else {
            return -1;
        }
        if (!caller_pc)
            return (long)count;
        record_frame(frames, &count, caller_pc);
        pc = caller_pc;
        sp = caller_sp;
        bp = caller_bp;
    }
    return (long)count;
}

size_t take_stack(uintptr_t *frames, size_t max)
{
    if (!libgcc_only) {
        long count = rule_stack(frames, max);
        if (count >= 0)
            return (size_t)count;
        __atomic_add_fetch(&libgcc_walks, 1, __ATOMIC_RELAXED);
    }
    return libgcc_stack(frames, max);
}

uintptr_t *copy_frames(const uintptr_t *frames, size_t count)
{
    uintptr_t *copy = __libc_malloc(count * sizeof *copy);
    if (copy)
        memcpy(copy, frames, count * sizeof *copy);
    return copy;
}

void write_all(int fd, const char *text, size_t length)
{
    while (length) {
        ssize_t done = write(fd, text, length);
        if (done < 0 && errno == EINTR)
            continue;
        if (done <= 0)
            return;
        text += done;
        length -= (size_t)done;
    }
}

// One line on stderr in one write, so that threads' lines do not interleave.
void log_line(const char *fmt, ...)
{
    char line[1024];
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, args);
    va_end(args);
    if (n < 0)
        return;
    size_t length = (size_t)n < sizeof line - 1 ? (size_t)n : sizeof line - 2;
    line[length++] = '\n';
    write_all(STDERR_FILENO, line, length);
}

// Frames as malloc_debug logs them: module-relative pc, module, symbol+offset.
void log_backtrace(struct frame_names *names, const uintptr_t *frames, size_t count)
{
    struct frame_names *own = names ? NULL : frame_names_open();
    for (size_t i = 0; i < count; i++) {
        struct frame_name frame;
        frame_name(names ? names : own, frames[i], &frame);
        const char *module = frame.module && *frame.module ? frame.module : "<unknown>";
        if (frame.function)
            log_line("          #%02zu  pc %016lx  %s (%s+%lu)", i, (unsigned long)frame.rel_pc, module, frame.function,
                     (unsigned long)frame.offset);
        else
            log_line("          #%02zu  pc %016lx  %s", i, (unsigned long)frame.rel_pc, module);
    }
    frame_names_close(own);
}
