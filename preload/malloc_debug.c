// leaktrace's in-process engine: an LD_PRELOAD library that gives glibc programs
// Android's malloc_debug API (get_malloc_leak_info, free_malloc_leak_info,
// malloc_backtrace) and its LIBC_DEBUG_MALLOC_OPTIONS, for the options that
// record live allocations:
//   backtrace[=N] backtrace_size backtrace_min_size backtrace_max_size
//   backtrace_dump_on_exit backtrace_dump_prefix leak_track
// The heap dump ("Android Native Heap Dump v1.2") is written on SIGRTMAX-17, at
// the next allocator call, and at exit with backtrace_dump_on_exit; leak_track
// logs every live block on stderr at exit. LIBC_DEBUG_MALLOC_PROGRAM limits it
// to programs whose name contains that text.
//
// Every allocation goes to glibc (__libc_malloc and friends); the library keeps
// a table of live blocks with their stacks, taken with libgcc's DWARF unwinder
// (no frame pointers needed). A thread-local flag sends calls made while the
// library itself runs (the unwinder, a signal handler that allocates) straight
// to glibc, untracked: no recursion, no deadlock on the table's lock.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>
#include <unwind.h>

#include "options.h"   // generated from tracer/malloc_options.py: the one list of options

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);

#define ZYGOTE_BIT (1UL << 31)
#define MAX_FRAMES 256
#define DUMP_SIGNAL (SIGRTMAX - 17)

struct record {
    uintptr_t pointer;        // 0: empty slot; 1: deleted
    size_t size;
    uint32_t zygote;          // allocated before a fork, in the parent
    uint32_t frame_count;
    uintptr_t *frames;        // pcs inside the call instruction, as bionic stores them
};

static struct {
    int state;                // 0: not read yet; 1: on; 2: off (bad options or other program)
    size_t frames;            // backtrace=N; 0 when no option asks for stacks
    size_t min_size, max_size;
    int dump_on_exit, leak_track;
    char prefix[256];
} config;

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
// Exported so that leaktrace can read the table from a frozen copy of the process
// (--unreachable): slot i is leaktrace_table[i], 32 bytes, as struct record lays it out.
struct record *leaktrace_table;
size_t leaktrace_table_slots;
static size_t table_used, table_live;
static volatile sig_atomic_t dump_requested;
static __thread int inside __attribute__((tls_model("initial-exec")));
static uintptr_t own_start, own_end;   // this library's code: its frames are left out

// --- options -------------------------------------------------------------

static void option_error(const char *fmt, const char *name, const char *detail)
{
    fprintf(stderr, "%s: ", program_invocation_short_name);
    fprintf(stderr, fmt, name, detail);
    fputc('\n', stderr);
}

// One value as bionic's Config parses it; returns 0 and an error on stderr if bad.
static int parse_number(const char *name, const char *value, const struct option_spec *spec, size_t *out)
{
    char *end;
    errno = 0;
    long number = strtol(value, &end, 10);
    if (errno == ERANGE) {
        option_error("bad value for option '%s': %s", name, strerror(ERANGE));
        return 0;
    }
    if (end == value) {
        option_error("bad value for option '%s'%s", name, "");
        return 0;
    }
    if (*end) {
        option_error("bad value for option '%s', non space found after option: %s", name, end);
        return 0;
    }
    char text[32];
    snprintf(text, sizeof text, "%ld", number);
    if (number < 0) {
        option_error("bad value for option '%s', value cannot be negative: %s", name, text);
        return 0;
    }
    if ((unsigned long)number < spec->minimum) {
        fprintf(stderr, "%s: bad value for option '%s', value must be >= %zu: %ld\n",
                program_invocation_short_name, name, spec->minimum, number);
        return 0;
    }
    if ((unsigned long)number > spec->maximum) {
        fprintf(stderr, "%s: bad value for option '%s', value must be <= %zu: %ld\n",
                program_invocation_short_name, name, spec->maximum, number);
        return 0;
    }
    *out = (size_t)number;
    return 1;
}

static const struct option_spec *find_option(const char *name)
{
    for (size_t i = 0; i < sizeof option_specs / sizeof option_specs[0]; i++) {
        const struct option_spec *spec = &option_specs[i];
        if (!strcmp(spec->name, name) || (spec->alias && !strcmp(spec->alias, name)))
            return spec;
    }
    return NULL;
}

// Applies one parsed option; only the recording options change anything here.
static int apply(const struct option_spec *spec, const char *name, const char *value)
{
    size_t number = spec->default_number;
    if (!spec->supported) {
        fprintf(stderr, "%s: option '%s' is not supported by leaktrace's library yet\n",
                program_invocation_short_name, spec->name);
        return 0;
    }
    if (spec->takes == TAKES_FLAG && *value) {
        option_error("value set for option '%s' which does not take a value%s", name, "");
        return 0;
    }
    if ((spec->takes == TAKES_SIZE || (spec->takes == TAKES_INT && *value)) &&
        !parse_number(name, value, spec, &number))
        return 0;
    if (!strcmp(spec->name, "backtrace") || !strcmp(spec->name, "backtrace_enable_on_signal"))
        config.frames = number;
    else if (!strcmp(spec->name, "backtrace_size"))
        config.min_size = config.max_size = number;
    else if (!strcmp(spec->name, "backtrace_min_size"))
        config.min_size = number;
    else if (!strcmp(spec->name, "backtrace_max_size"))
        config.max_size = number;
    else if (!strcmp(spec->name, "backtrace_dump_on_exit"))
        config.dump_on_exit = 1;
    else if (!strcmp(spec->name, "leak_track"))
        config.leak_track = 1;
    else if (!strcmp(spec->name, "backtrace_dump_prefix"))
        snprintf(config.prefix, sizeof config.prefix, "%s", *value ? value : DEFAULT_DUMP_PREFIX);
    return 1;
}

// Splits the string as bionic's Config::GetOption does; 0 on the first bad option.
static int parse_options(const char *text)
{
    char name[128], value[256];
    const char *p = text;
    for (;;) {
        while (*p == ' ' || (*p >= '\t' && *p <= '\r'))
            p++;
        if (!*p)
            return 1;
        size_t n = 0;
        while (*p && !(*p == ' ' || (*p >= '\t' && *p <= '\r')) && *p != '=')
            if (n < sizeof name - 1)
                name[n++] = *p++;
            else
                p++;
        name[n] = 0;
        while (*p == ' ' || (*p >= '\t' && *p <= '\r'))
            p++;
        size_t v = 0;
        if (*p == '=') {
            p++;
            while (*p == ' ' || (*p >= '\t' && *p <= '\r'))
                p++;
            while (*p && !(*p == ' ' || (*p >= '\t' && *p <= '\r')))
                if (v < sizeof value - 1)
                    value[v++] = *p++;
                else
                    p++;
        }
        value[v] = 0;
        const struct option_spec *spec = find_option(name);
        if (!spec) {
            fprintf(stderr, "%s: unknown option %s\n", program_invocation_short_name, name);
            return 0;
        }
        if (!apply(spec, name, value))
            return 0;
    }
}

static void on_dump_signal(int sig)
{
    (void)sig;
    dump_requested = 1;   // written at the next allocator call, outside any lock
}

static int find_own_code(struct dl_phdr_info *info, size_t size, void *data)
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

static void after_fork_in_child(void);
static void before_fork(void) { pthread_mutex_lock(&table_lock); }
static void after_fork_in_parent(void) { pthread_mutex_unlock(&table_lock); }

// Reads the options once, on the first allocator call (constructors of other
// libraries may allocate before ours runs).
static void read_config(void)
{
    const char *options = getenv("LIBC_DEBUG_MALLOC_OPTIONS");
    const char *program = getenv("LIBC_DEBUG_MALLOC_PROGRAM");
    config.max_size = SIZE_MAX;
    snprintf(config.prefix, sizeof config.prefix, "%s", DEFAULT_DUMP_PREFIX);
    if (!options || !*options || (program && *program && !strstr(program_invocation_short_name, program))) {
        config.state = 2;
        return;
    }
    if (!parse_options(options)) {
        fprintf(stderr, "%s: malloc debug disabled: bad LIBC_DEBUG_MALLOC_OPTIONS\n", program_invocation_short_name);
        config.state = 2;
        return;
    }
    dl_iterate_phdr(find_own_code, (void *)(uintptr_t)read_config);
    signal(DUMP_SIGNAL, on_dump_signal);
    pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
    __atomic_store_n(&config.state, 1, __ATOMIC_RELEASE);
}

// --- the leaktrace_table of live blocks -------------------------------------------

static size_t slot_of(uintptr_t pointer)
{
    uint64_t h = pointer * 0x9e3779b97f4a7c15ULL;
    return (size_t)(h >> 17) & (leaktrace_table_slots - 1);
}

static int grow(void)
{
    size_t slots = leaktrace_table_slots ? leaktrace_table_slots * 2 : 4096;
    struct record *bigger = __libc_calloc(slots, sizeof *bigger);
    if (!bigger)
        return 0;
    struct record *old = leaktrace_table;
    size_t old_slots = leaktrace_table_slots;
    leaktrace_table = bigger;
    leaktrace_table_slots = slots;
    table_used = table_live;
    for (size_t i = 0; i < old_slots; i++) {
        if (old[i].pointer > 1) {
            size_t j = slot_of(old[i].pointer);
            while (leaktrace_table[j].pointer)
                j = (j + 1) & (leaktrace_table_slots - 1);
            leaktrace_table[j] = old[i];
        }
    }
    __libc_free(old);
    return 1;
}

static void insert(uintptr_t pointer, size_t size, uintptr_t *frames, uint32_t frame_count)
{
    pthread_mutex_lock(&table_lock);
    if ((table_used + 1) * 2 > leaktrace_table_slots && !grow()) {
        pthread_mutex_unlock(&table_lock);
        __libc_free(frames);
        return;
    }
    size_t j = slot_of(pointer);
    while (leaktrace_table[j].pointer > 1 && leaktrace_table[j].pointer != pointer)
        j = (j + 1) & (leaktrace_table_slots - 1);
    if (leaktrace_table[j].pointer == pointer) {
        __libc_free(leaktrace_table[j].frames);   // glibc handed the address out again: its free went unseen
    } else {
        if (!leaktrace_table[j].pointer)
            table_used++;
        table_live++;
    }
    leaktrace_table[j] = (struct record){pointer, size, 0, frame_count, frames};
    pthread_mutex_unlock(&table_lock);
}

// Takes a block's record out of the leaktrace_table; returns 0 if it was not there.
static int take(uintptr_t pointer, struct record *out)
{
    int found = 0;
    pthread_mutex_lock(&table_lock);
    if (leaktrace_table_slots) {
        size_t j = slot_of(pointer);
        while (leaktrace_table[j].pointer && leaktrace_table[j].pointer != pointer)
            j = (j + 1) & (leaktrace_table_slots - 1);
        if (leaktrace_table[j].pointer == pointer) {
            *out = leaktrace_table[j];
            leaktrace_table[j].pointer = 1;
            table_live--;
            found = 1;
        }
    }
    pthread_mutex_unlock(&table_lock);
    return found;
}

static void erase(uintptr_t pointer)
{
    struct record gone;
    if (take(pointer, &gone))
        __libc_free(gone.frames);
}

static void after_fork_in_child(void)
{
    for (size_t i = 0; i < leaktrace_table_slots; i++)
        if (leaktrace_table[i].pointer > 1)
            leaktrace_table[i].zygote = 1;
    pthread_mutex_init(&table_lock, NULL);
}

// --- stacks --------------------------------------------------------------

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
    if (pc >= own_start && pc < own_end && state->count == 0)
        return _URC_NO_REASON;   // still inside this library
    if (pc >= 4096)
        pc -= 1;                 // into the call instruction, as bionic adjusts it on x86
    state->frames[state->count++] = pc;
    return state->count >= state->max ? _URC_END_OF_STACK : _URC_NO_REASON;
}

static void record(void *pointer, size_t size)
{
    if (!pointer)
        return;
    uintptr_t *frames = NULL;
    uint32_t count = 0;
    if (config.frames && size >= config.min_size && size <= config.max_size) {
        uintptr_t buffer[MAX_FRAMES];
        struct unwind_state state = {buffer, 0, config.frames};
        _Unwind_Backtrace(take_frame, &state);
        if (state.count && (frames = __libc_malloc(state.count * sizeof *frames))) {
            memcpy(frames, buffer, state.count * sizeof *frames);
            count = (uint32_t)state.count;
        }
    }
    insert((uintptr_t)pointer, size, frames, count);
}

// --- reports -------------------------------------------------------------

static int compare_records(const void *left, const void *right)
{
    const struct record *a = left, *b = right;
    if (a->zygote != b->zygote)
        return a->zygote ? 1 : -1;                       // z 0 first
    if (a->size != b->size)
        return a->size > b->size ? -1 : 1;              // larger first
    if (!a->frame_count != !b->frame_count)
        return a->frame_count ? -1 : 1;                  // with frames first
    if (!a->frame_count || a->frame_count == b->frame_count)
        return (a->pointer > b->pointer) - (a->pointer < b->pointer);
    return a->frame_count > b->frame_count ? -1 : 1;     // deeper first
}

static int same_entry(const struct record *a, const struct record *b)
{
    return a->zygote == b->zygote && a->size == b->size && a->frame_count == b->frame_count &&
           (!a->frame_count || !memcmp(a->frames, b->frames, a->frame_count * sizeof *a->frames));
}

// Every live block, sorted as malloc_debug sorts them; frames are copied. The
// caller frees the list and each frames array with __libc_free.
static struct record *snapshot_records(size_t *count)
{
    pthread_mutex_lock(&table_lock);
    struct record *list = __libc_malloc((table_live ? table_live : 1) * sizeof *list);
    size_t n = 0;
    for (size_t i = 0; list && i < leaktrace_table_slots; i++) {
        if (leaktrace_table[i].pointer <= 1)
            continue;
        list[n] = leaktrace_table[i];
        list[n].frames = NULL;
        if (leaktrace_table[i].frame_count && (list[n].frames = __libc_malloc(leaktrace_table[i].frame_count * sizeof(uintptr_t))))
            memcpy(list[n].frames, leaktrace_table[i].frames, leaktrace_table[i].frame_count * sizeof(uintptr_t));
        else
            list[n].frame_count = 0;
        n++;
    }
    pthread_mutex_unlock(&table_lock);
    if (list)
        qsort(list, n, sizeof *list, compare_records);
    *count = list ? n : 0;
    return list;
}

static void free_records(struct record *list, size_t count)
{
    for (size_t i = 0; i < count; i++)
        __libc_free(list[i].frames);
    __libc_free(list);
}

void get_malloc_leak_info(uint8_t **info, size_t *overall_size, size_t *info_size, size_t *total_memory,
                          size_t *backtrace_size)
{
    *info = NULL;
    *overall_size = *info_size = *total_memory = *backtrace_size = 0;
    if (config.state != 1 || !config.frames)
        return;
    inside++;
    size_t count;
    struct record *list = snapshot_records(&count);
    size_t depth = config.frames, width = sizeof(size_t) * 2 + sizeof(uintptr_t) * depth, entries = 0;
    uint8_t *buffer = count ? __libc_calloc(count, width) : NULL;
    const struct record *last = NULL;   // the record the last entry was made from
    for (size_t i = 0; buffer && i < count; i++) {
        if (list[i].size > ZYGOTE_BIT - 1)
            continue;   // the size would run into the zygote bit
        if (last && same_entry(last, &list[i])) {
            ((size_t *)(buffer + (entries - 1) * width))[1]++;
        } else {
            size_t *entry = (size_t *)(buffer + entries++ * width);
            entry[0] = list[i].size | (list[i].zygote ? ZYGOTE_BIT : 0);
            entry[1] = 1;
            memcpy(entry + 2, list[i].frames, list[i].frame_count * sizeof(uintptr_t));
            last = &list[i];
        }
        *total_memory += list[i].size;
    }
    free_records(list, count);
    if (entries) {
        *info = buffer;
        *overall_size = entries * width;
        *info_size = width;
        *backtrace_size = depth;
    } else {
        __libc_free(buffer);
    }
    inside--;
}

void free_malloc_leak_info(uint8_t *info)
{
    __libc_free(info);
}

ssize_t malloc_backtrace(void *pointer, uintptr_t *frames, size_t frame_count)
{
    ssize_t found = 0;
    pthread_mutex_lock(&table_lock);
    if (leaktrace_table_slots) {
        size_t j = slot_of((uintptr_t)pointer);
        while (leaktrace_table[j].pointer && leaktrace_table[j].pointer != (uintptr_t)pointer)
            j = (j + 1) & (leaktrace_table_slots - 1);
        if (leaktrace_table[j].pointer == (uintptr_t)pointer) {
            found = leaktrace_table[j].frame_count < frame_count ? leaktrace_table[j].frame_count : frame_count;
            memcpy(frames, leaktrace_table[j].frames, found * sizeof *frames);
        }
    }
    pthread_mutex_unlock(&table_lock);
    return found;
}

static void write_all(int fd, const char *text, size_t length)
{
    while (length) {
        ssize_t done = write(fd, text, length);
        if (done <= 0) {
            if (done < 0 && errno == EINTR)
                continue;
            return;
        }
        text += done;
        length -= (size_t)done;
    }
}

static void put(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(int fd, const char *fmt, ...)
{
    char line[4096];
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(line, sizeof line, fmt, args);
    va_end(args);
    if (n > 0)
        write_all(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

// The v1.2 heap dump, written to a temporary file and renamed into place.
static void write_dump(const char *suffix)
{
    char path[512], temporary[520];
    snprintf(path, sizeof path, "%s.%d%s", config.prefix, getpid(), suffix);
    snprintf(temporary, sizeof temporary, "%s.tmp", path);
    int fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "%s: cannot write heap dump %s: %s\n", program_invocation_short_name, path, strerror(errno));
        return;
    }
    size_t count, total = 0, entries = 0;
    struct record *list = snapshot_records(&count);
    for (size_t i = 0; i < count; i++) {
        total += list[i].size;
        entries += !i || !same_entry(&list[i - 1], &list[i]);
    }
    struct utsname name;
    uname(&name);
    put(fd, "Android Native Heap Dump v1.2\n\nBuild fingerprint: '%s/%s/%s'\n\n", name.sysname, name.release,
        name.machine);
    put(fd, "Total memory: %zu\nAllocation records: %zu\nBacktrace size: %zu\n\n", total, entries, config.frames);
    for (size_t i = 0; i < count;) {
        size_t j = i + 1;
        while (j < count && same_entry(&list[i], &list[j]))
            j++;
        put(fd, "z %d  sz %8zu  num    %zu  bt", list[i].zygote ? 1 : 0, list[i].size, j - i);
        for (uint32_t f = 0; f < list[i].frame_count; f++)
            put(fd, " %lx", (unsigned long)list[i].frames[f]);
        put(fd, "\n");
        i = j;
    }
    free_records(list, count);
    put(fd, "MAPS\n");
    int maps = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (maps < 0) {
        put(fd, "Could not open /proc/self/maps\n");
    } else {
        char block[4096];
        ssize_t n;
        while ((n = read(maps, block, sizeof block)) > 0)
            write_all(fd, block, (size_t)n);
        close(maps);
    }
    put(fd, "END\n");
    close(fd);
    if (rename(temporary, path) != 0)
        unlink(temporary);
}

static void log_frame(size_t number, uintptr_t pc)
{
    Dl_info where;
    if (dladdr((void *)pc, &where) && where.dli_fname) {
        uintptr_t rel_pc = pc - (uintptr_t)where.dli_fbase;
        if (where.dli_sname)
            fprintf(stderr, "          #%02zu  pc %016lx  %s (%s+%lu)\n", number, (unsigned long)rel_pc,
                    where.dli_fname, where.dli_sname, (unsigned long)(pc - (uintptr_t)where.dli_saddr));
        else
            fprintf(stderr, "          #%02zu  pc %016lx  %s\n", number, (unsigned long)rel_pc, where.dli_fname);
    } else {
        fprintf(stderr, "          #%02zu  pc %016lx  <unknown>\n", number, (unsigned long)pc);
    }
}

// leak_track: every live block, in malloc_debug's order and words.
static void log_leaks(void)
{
    size_t count;
    struct record *list = snapshot_records(&count);
    for (size_t i = 0; i < count; i++) {
        fprintf(stderr, "+++ %s leaked block of size %zu at 0x%lx (leak %zu of %zu)\n", program_invocation_short_name,
                list[i].size, (unsigned long)list[i].pointer, i + 1, count);
        if (list[i].frame_count) {
            fprintf(stderr, "Backtrace at time of allocation:\n");
            for (uint32_t f = 0; f < list[i].frame_count; f++)
                log_frame(f, list[i].frames[f]);
        }
    }
    free_records(list, count);
}

__attribute__((destructor)) static void at_exit(void)
{
    if (config.state != 1)
        return;
    inside++;
    if (config.dump_on_exit)
        write_dump(".exit.txt");
    if (config.leak_track)
        log_leaks();
    inside--;
}

// --- the allocator entry points -------------------------------------------

static int tracking(void);

// A program that never allocates still hears about bad options.
__attribute__((constructor)) static void at_start(void)
{
    tracking();
}

// Nonzero when this call is to be recorded (and, first, a requested dump written).
static int tracking(void)
{
    static int claimed;
    if (inside)
        return 0;
    if (!config.state) {
        if (__sync_bool_compare_and_swap(&claimed, 0, 1)) {   // one thread reads, the others wait
            inside++;
            read_config();
            inside--;
        }
        while (!__atomic_load_n(&config.state, __ATOMIC_ACQUIRE))
            ;
    }
    if (config.state != 1)
        return 0;
    if (dump_requested) {
        dump_requested = 0;
        inside++;
        write_dump(".txt");
        inside--;
    }
    return 1;
}

#define TRACKED(call, size, result)        \
    do {                                    \
        if (!tracking())                    \
            return call;                    \
        inside++;                           \
        result = call;                      \
        record(result, size);               \
        inside--;                           \
        return result;                      \
    } while (0)

void *malloc(size_t size)
{
    void *result;
    TRACKED(__libc_malloc(size), size, result);
}

void *calloc(size_t count, size_t size)
{
    void *result;
    size_t total;
    if (__builtin_mul_overflow(count, size, &total))
        total = 0;   // glibc fails the call; nothing is recorded
    TRACKED(__libc_calloc(count, size), total, result);
}

void free(void *pointer)
{
    if (pointer && !inside && config.state == 1) {
        inside++;
        erase((uintptr_t)pointer);
        inside--;
    }
    __libc_free(pointer);
}

void *realloc(void *pointer, size_t size)
{
    if (!tracking())
        return __libc_realloc(pointer, size);
    inside++;
    // Out of the leaktrace_table before glibc may hand the address to another thread.
    struct record old;
    int had = pointer && take((uintptr_t)pointer, &old);
    void *result = __libc_realloc(pointer, size);
    if (had && !result && size)
        insert(old.pointer, old.size, old.frames, old.frame_count);   // failed: the block stays
    else if (had)
        __libc_free(old.frames);
    if (result)
        record(result, size);
    inside--;
    return result;
}

void *reallocarray(void *pointer, size_t count, size_t size)
{
    size_t total;
    if (__builtin_mul_overflow(count, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(pointer, total);
}

void *memalign(size_t alignment, size_t size)
{
    void *result;
    TRACKED(__libc_memalign(alignment, size), size, result);
}

void *aligned_alloc(size_t alignment, size_t size)
{
    if (alignment == 0 || (alignment & (alignment - 1))) {
        errno = EINVAL;   // glibc 2.36's aligned_alloc: a power of two
        return NULL;
    }
    return memalign(alignment, size);
}

int posix_memalign(void **out, size_t alignment, size_t size)
{
    if (alignment % sizeof(void *) || (alignment & (alignment - 1)) || !alignment)
        return EINVAL;
    void *result = memalign(alignment, size);
    if (!result)
        return ENOMEM;
    *out = result;
    return 0;
}

void *valloc(size_t size)
{
    void *result;
    TRACKED(__libc_valloc(size), size, result);
}

void *pvalloc(size_t size)
{
    long page = sysconf(_SC_PAGESIZE);
    void *result;
    TRACKED(__libc_pvalloc(size), (size + page - 1) & ~(size_t)(page - 1), result);
}

size_t malloc_usable_size(void *pointer)
{
    static size_t (*glibc_usable_size)(void *);
    if (!glibc_usable_size) {
        inside++;
        glibc_usable_size = (size_t (*)(void *))dlsym(RTLD_NEXT, "malloc_usable_size");
        inside--;
    }
    return glibc_usable_size ? glibc_usable_size(pointer) : 0;
}
