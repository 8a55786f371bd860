// Stacks (no frame pointers needed) and their lines in the log. The walk follows each frame
// by the rule cfi.c works out from .eh_frame, cached by pc; a frame it cannot follow has the
// whole stack taken again by libgcc's _Unwind_Backtrace, which gives the same frames.
#include "stacks.h"
#include "frame_names.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/ucontext.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <unwind.h>
#endif

#include "arch.h"
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
// each one moved back into its call instruction, as bionic moves it.
static void record_frame(uintptr_t *frames, size_t *count, uintptr_t pc)
{
    if (*count == 0 && pc >= own_start && pc < own_end)
        return;
    frames[(*count)++] = pc >= 4096 ? pc - ARCH_CALL_SITE_BACK : pc;
}

#ifdef __GLIBC__
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
#endif

#if ARCH_ROWS_WALK  // the walk by rows, and the cache of its rules (else every stack is libgcc's)
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
    if (pc >> ARCH_USER_ADDRESS_BITS || row->cfa_offset < 0 || row->cfa_offset >= RULE_OFFSET_LIMIT ||
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

static unsigned rules_generation;  // moves on whenever rules are forgotten

// Code unloaded, and perhaps other code loaded at its addresses: no rule of it is kept.
static void forget_rules(void)
{
    for (size_t i = 0; i < sizeof rule_cache / sizeof *rule_cache; i++)
        __atomic_store_n(&rule_cache[i], 0, __ATOMIC_RELAXED);
    __atomic_add_fetch(&rules_generation, 1, __ATOMIC_RELEASE);
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
#endif

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

#if ARCH_ROWS_WALK
// One state of a walk (pc, sp; exact: pc is where execution is, not a return address) and
// what the step out of it read: the CFA from rbp (then bp is rbp) or not, and where rbp's saved
// value was (0: rbp was kept).
struct walk_point {
    uintptr_t pc, sp, bp, bp_at;
    int exact, cfa_from_bp;
};

// A thread's last walk, innermost point first. A walk at one of its points takes the same next
// step as it did whenever the stack holds the words that step read, so it is copied, not
// recomputed: the steps shared by two stacks (the outer frames) cost a compare each.
#define MEMO_POINTS 64
struct walk_memo {
    struct walk_point points[2][MEMO_POINTS];
    unsigned count[2], last;  // points[last] holds the last walk's count[last] points
    unsigned generation;      // rules_generation when they were taken
};

#define MEMO_NONE ((struct walk_memo *)1)  // no memory for one, or the thread is ending
#define MEMO_BUSY ((struct walk_memo *)2)  // a walk of this thread has it (a signal came in its middle)
static THREAD_LOCAL struct walk_memo *thread_memo;
static pthread_key_t memo_key;
static pthread_once_t memo_key_once = PTHREAD_ONCE_INIT;
static int memo_key_made;

static void drop_memo(void *memo)
{
    munmap(memo, sizeof(struct walk_memo));
    thread_memo = MEMO_NONE;
}

static void make_memo_key(void)
{
    memo_key_made = !pthread_key_create(&memo_key, drop_memo);
}

// The thread's memo, made at its first walk and unmapped when it ends, taken until memo_back;
// NULL if it has none or is already in a walk. It is a mapping of its own, not a heap block: a
// heap walk finds there only the program's blocks and the table's.
static struct walk_memo *memo_taken(void)
{
    struct walk_memo *memo = thread_memo;
    if (memo == MEMO_NONE || memo == MEMO_BUSY)
        return NULL;
    if (!memo) {
        pthread_once(&memo_key_once, make_memo_key);
        memo = memo_key_made ? mmap(NULL, sizeof *memo, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                             : MAP_FAILED;
        if (memo == MAP_FAILED) {
            memo = NULL;
        } else if (pthread_setspecific(memo_key, memo)) {
            munmap(memo, sizeof *memo);
            memo = NULL;
        }
        thread_memo = memo ? memo : MEMO_NONE;
    }
    if (memo) {
        thread_memo = MEMO_BUSY;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
    }
    return memo;
}

static void memo_back(struct walk_memo *memo)
{
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    thread_memo = memo;
}

static inline uintptr_t stack_word(uintptr_t address)
{
    uintptr_t word;
    memcpy(&word, (const void *)address, sizeof word);
    return word;
}

// A walk in progress: its frames, its state, and its points kept for the next walk, each joined
// to the next by a step whose reads are known.
struct walk {
    uintptr_t *frames;
    size_t count, max;
    uintptr_t pc, sp, bp;
    int exact, recording;
    struct walk_point *fresh;
    size_t taken;
};

static inline __attribute__((always_inline)) void keep_point(struct walk *w)
{
    if (!w->recording || w->taken == MEMO_POINTS) {
        w->recording = 0;
        return;
    }
    struct walk_point *point = &w->fresh[w->taken++];
    point->pc = w->pc, point->sp = w->sp, point->exact = w->exact;
}

// What the step out of the walk's point read. rbp's value is kept only where the CFA came from
// it (a frame pointer): elsewhere it may be the program's data, and a heap walk would find the
// blocks it points to reachable from the memo.
static inline __attribute__((always_inline)) void note_step(struct walk *w, uintptr_t bp_at, int cfa_from_bp)
{
    if (!w->recording)
        return;
    struct walk_point *point = &w->fresh[w->taken - 1];
    point->bp_at = bp_at, point->cfa_from_bp = cfa_from_bp, point->bp = cfa_from_bp ? w->bp : 0;
}

// From last[from], whose pc, sp and exactness the walk has, takes the last walk's steps while
// they read what they read then: the same return address, and rbp's value where the CFA came
// from it. Makes no read the walk itself would not make. Returns the index of the point reached.
static inline __attribute__((always_inline)) size_t follow_last_walk(struct walk *w, const struct walk_point *last,
                                                                     size_t from, size_t last_count)
{
    size_t at = from;
    while (at + 1 < last_count && w->count < w->max) {
        const struct walk_point *step = &last[at], *next = &last[at + 1];
        if ((step->cfa_from_bp && w->bp != step->bp) || stack_word(next->sp - 8) != next->pc)
            break;
        note_step(w, step->bp_at, step->cfa_from_bp);
        if (step->bp_at)
            w->bp = stack_word(step->bp_at);
        record_frame(w->frames, &w->count, next->pc);
        w->pc = next->pc, w->sp = next->sp, w->exact = next->exact;
        keep_point(w);
        at++;
    }
    return at;
}

// The frames above this call, recorded as take_frame records them; -1 at a frame the rules
// cannot follow (*followed: the frames recorded up to it).
__attribute__((noinline)) static long rule_stack(uintptr_t *frames, size_t max, size_t *followed)
{
    struct walk w = {.frames = frames, .max = max, .exact = 1};
    __asm__ volatile("lea 0(%%rip), %0\n\tmov %%rsp, %1\n\tmov %%rbp, %2" : "=r"(w.pc), "=r"(w.sp), "=r"(w.bp));
    struct walk_memo *memo = memo_taken();
    const struct walk_point *last = NULL;
    size_t last_count = 0, last_at = 0;
    if (memo) {
        unsigned generation = __atomic_load_n(&rules_generation, __ATOMIC_ACQUIRE);
        if (memo->generation == generation) {
            last = memo->points[memo->last];
            last_count = memo->count[memo->last];
        }
        memo->generation = generation;
        w.fresh = memo->points[!memo->last];
        w.recording = 1;
    }
    long result;
    keep_point(&w);
    while (1) {
        while (last_at < last_count && last[last_at].sp < w.sp)
            last_at++;
        if (last_at < last_count && last[last_at].sp == w.sp && last[last_at].pc == w.pc &&
            last[last_at].exact == w.exact)
            last_at = follow_last_walk(&w, last, last_at, last_count) + 1;  // parted: they may meet again
        if (w.count >= max) {
            result = (long)w.count;
            break;
        }
        struct rule rule;
        if (!rule_at(w.exact ? w.pc : w.pc - 1, &rule)) {
            result = (long)w.count;  // no FDE: libgcc's walk ends here too
            break;
        }
        uintptr_t caller_pc, caller_sp, caller_bp = w.bp;
        if (rule.cfa_rule == CFA_END) {
            result = (long)w.count;
            break;
        } else if (rule.cfa_rule == CFA_SIGNAL) {
            const greg_t *registers = ((const ucontext_t *)w.sp)->uc_mcontext.gregs;
            caller_pc = (uintptr_t)registers[REG_RIP];
            caller_sp = (uintptr_t)registers[REG_RSP];
            caller_bp = (uintptr_t)registers[REG_RBP];
            w.exact = 1;
            w.recording = 0;  // a step that reads registers, not the words a point's step is checked by
        } else if (rule.cfa_rule == CFA_RSP || rule.cfa_rule == CFA_RBP) {
            uintptr_t cfa = (rule.cfa_rule == CFA_RSP ? w.sp : w.bp) + (uintptr_t)rule.cfa_offset;
            if (cfa <= w.sp) {
                result = -1;  // the stack would not shrink
                break;
            }
            caller_pc = stack_word(cfa - 8);
            uintptr_t bp_at = rule.rbp_saved ? cfa + (uintptr_t)rule.rbp_offset : 0;
            note_step(&w, bp_at, rule.cfa_rule == CFA_RBP);
            if (bp_at)
                caller_bp = stack_word(bp_at);
            caller_sp = cfa;
            w.exact = 0;
        } else {
            result = -1;
            break;
        }
        if (!caller_pc) {
            result = (long)w.count;
            break;
        }
        record_frame(frames, &w.count, caller_pc);
        w.pc = caller_pc, w.sp = caller_sp, w.bp = caller_bp;
        keep_point(&w);
    }
    *followed = w.count;
    if (memo) {
        memo->last = !memo->last;
        memo->count[memo->last] = (unsigned)w.taken;
        memo_back(memo);
    }
    return result;
}
#endif

size_t take_stack(uintptr_t *frames, size_t max)
{
    size_t followed = 0;
#if ARCH_ROWS_WALK
    if (!libgcc_only) {
        long count = rule_stack(frames, max, &followed);
        if (count >= 0)
            return (size_t)count;
        __atomic_add_fetch(&libgcc_walks, 1, __ATOMIC_RELAXED);
    }
#endif
#ifdef __GLIBC__
    (void)followed;  // libgcc's walk takes the whole stack again
    return libgcc_stack(frames, max);
#else
    return followed;  // musl ships no libgcc_s: the stack as far as the rules went
#endif
}

uintptr_t *copy_frames(const uintptr_t *frames, size_t count)
{
    uintptr_t *copy = own_malloc(count * sizeof *copy);
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
