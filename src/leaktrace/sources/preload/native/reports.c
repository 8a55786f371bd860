// What the library writes: the v1.2 heap dump and the leak_track log, in malloc_debug's order,
// words and layout, and the counters, sites and interpreters' code tables beside a dump.
#include "reports.h"
#include "frame_names.h"
#include "interpreter_stacks.h"
#include "sites.h"
#include "stacks.h"
#include "table.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

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

// backtrace_full's line: {"module" rel_pc "function" offset} per frame.
static void put_bt_info(int fd, struct frame_names *names, const struct record *r)
{
    put(fd, "  bt_info");
    for (uint32_t f = 0; f < r->frame_count; f++) {
        struct frame_name frame;
        frame_name(names, r->frames[f], &frame);
        put(fd, " {\"%s\" %lx \"%s\" %lx}", frame.module ? frame.module : "", (unsigned long)frame.rel_pc,
            frame.function ? frame.function : "", (unsigned long)frame.offset);
    }
    put(fd, "\n");
}

// A file of the dump prefix's, PREFIX.PID<suffix>, opened as a temporary to be renamed into
// place by put_in_place; -1 (said on stderr) if it cannot be made.
struct report_file {
    char path[PATH_MAX], temporary[PATH_MAX + sizeof ".tmp"];
};

static int open_report(struct report_file *file, const char *what, const char *suffix)
{
    int length = snprintf(file->path, sizeof file->path, "%s.%d%s", config.prefix, getpid(), suffix);
    if (length < 0 || (size_t)length >= sizeof file->path) {  // never a shortened path
        log_line("%s: cannot write %s: %s.%d%s is too long", program_invocation_short_name, what, config.prefix,
                 getpid(), suffix);
        return -1;
    }
    snprintf(file->temporary, sizeof file->temporary, "%s.tmp", file->path);
    int fd = open(file->temporary, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        log_line("%s: cannot write %s %s: %s", program_invocation_short_name, what, file->path, strerror(errno));
    return fd;
}

static void put_in_place(int fd, const struct report_file *file)
{
    close(fd);
    if (rename(file->temporary, file->path) != 0)
        unlink(file->temporary);
}

void write_counters(const char *suffix)
{
    struct report_file file;
    int fd = open_report(&file, "counters", suffix);
    if (fd < 0)
        return;
    for (int i = 0; i < C_COUNTERS; i++)
        put(fd, i ? " %lu" : "%lu", (unsigned long)counter_value((enum counter)i));
    put(fd, "\n");
    put_in_place(fd, &file);
}

// The code objects each interpreter's frames named, as its walk keeps them, a file each.
void write_interpreter_codes(void)
{
    for (int which = 0; which < INTERPRETER_COUNT; which++) {
        struct kept_codes codes = interpreter_kept_codes(which);
        if (!codes.bytes)
            continue;
        struct report_file file;
        int fd = open_report(&file, codes.what, codes.suffix);
        if (fd < 0)
            continue;
        write_all(fd, (const char *)codes.start, codes.bytes);
        put_in_place(fd, &file);
    }
}

// The peak (layout.h's struct peak), then every site as it lies in memory (record.h's struct
// site, its slots, its frames): what leaktrace reads in place, for a process that is gone.
void write_sites(const char *suffix)
{
    struct report_file file;
    int fd = open_report(&file, "sites", suffix);
    if (fd < 0)
        return;
    sites_before_fork();  // every shard locked: no site is added while they are written
    struct peak peak = leaktrace_peak;
    write_all(fd, (const char *)&peak, sizeof peak);
    for (int s = 0; s < SITE_SHARDS; s++) {
        const struct site_shard *shard = &leaktrace_site_shards[s];
        for (size_t i = 0; i < shard->slot_count; i++) {
            const struct site *site = shard->slots[i];
            if (!site)
                continue;
            struct site_counts slots[SITE_SLOTS];
            memcpy(slots, site + 1, sizeof slots);
            for (int k = 0; k < SITE_SLOTS; k++)
                slots[k].lock = 0;  // a thread stopped with it held at exit changes nothing now
            write_all(fd, (const char *)site, sizeof *site);
            write_all(fd, (const char *)slots, sizeof slots);
            write_all(fd, (const char *)site->frames, site->frame_count * sizeof *site->frames);
        }
    }
    sites_after_fork(0);
    put_in_place(fd, &file);
}

// The v1.2 heap dump, written to a temporary file and renamed into place.
void write_dump(const char *suffix)
{
    struct report_file file;
    int fd = open_report(&file, "heap dump", suffix);
    if (fd < 0)
        return;
    size_t count, total = 0, entries = 0;
    struct record *list = table_snapshot(&count);
    for (size_t i = 0; i < count; i++) {
        total += list[i].size;
        entries += !i || !same_entry(&list[i - 1], &list[i]);
    }
    struct utsname name;
    uname(&name);
    put(fd, "Android Native Heap Dump v1.2\n\nBuild fingerprint: '%s/%s/%s'\n\n", name.sysname, name.release,
        name.machine);
    put(fd, "Total memory: %zu\nAllocation records: %zu\nBacktrace size: %zu\n\n", total, entries, config.frames);
    struct frame_names *names = config.backtrace_full && count ? frame_names_open() : NULL;
    for (size_t i = 0; i < count;) {
        size_t j = i + 1;
        while (j < count && same_entry(&list[i], &list[j]))
            j++;
        put(fd, "z %d  sz %8zu  num    %zu  bt", record_zygote_bit(&list[i]), list[i].size, j - i);
        for (uint32_t f = 0; f < list[i].frame_count; f++)
            put(fd, " %lx", (unsigned long)list[i].frames[f]);
        put(fd, "\n");
        if (config.backtrace_full && list[i].frame_count)
            put_bt_info(fd, names, &list[i]);
        i = j;
    }
    frame_names_close(names);
    free_records(list, count);
    put(fd, "MAPS\n");
    int maps =
        open("/proc/thread-self/maps", O_RDONLY | O_CLOEXEC);  // self's reads empty once the first thread has exited
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
    put_in_place(fd, &file);
}

// leak_track: every live block, in malloc_debug's order and words.
void log_leaks(void)
{
    size_t count;
    struct record *list = table_snapshot(&count);
    struct frame_names *names = count ? frame_names_open() : NULL;
    for (size_t i = 0; i < count; i++) {
        log_line("+++ %s leaked block of size %zu at 0x%lx (leak %zu of %zu)", program_invocation_short_name,
                 list[i].size, (unsigned long)list[i].pointer, i + 1, count);
        if (list[i].frame_count) {
            log_line("Backtrace at time of allocation:");
            log_backtrace(names, list[i].frames, list[i].frame_count);
        }
    }
    frame_names_close(names);
    free_records(list, count);
}
