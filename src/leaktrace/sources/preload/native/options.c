// LIBC_DEBUG_MALLOC_OPTIONS, read as bionic's Config reads it: the same names,
// ranges and messages as src/leaktrace/android/options.py (options.h is generated from it).
#include "library.h"
#include "stacks.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "options.h"

#define GUARD_ALIGNMENT 16  // the front guard keeps blocks 16-byte aligned, as on LP64 Android

struct config config;

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
        fprintf(stderr, "%s: bad value for option '%s', value must be >= %zu: %ld\n", program_invocation_short_name,
                name, spec->minimum, number);
        return 0;
    }
    if ((unsigned long)number > spec->maximum) {
        fprintf(stderr, "%s: bad value for option '%s', value must be <= %zu: %ld\n", program_invocation_short_name,
                name, spec->maximum, number);
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

static size_t guard_aligned(size_t bytes)
{
    return (bytes + GUARD_ALIGNMENT - 1) & ~(size_t)(GUARD_ALIGNMENT - 1);
}

// Writes one option's fields, as bionic's Config::Set* functions do (the last writer wins).
static void set(const char *name, size_t number, const char *value)
{
    if (!strcmp(name, "backtrace")) {
        config.frames = number;
        config.backtrace = config.track_allocs = 1;
    } else if (!strcmp(name, "backtrace_enable_on_signal")) {
        config.frames = number;
        config.enable_on_signal = config.track_allocs = 1;
    } else if (!strcmp(name, "backtrace_size")) {
        config.min_size = config.max_size = number;
    } else if (!strcmp(name, "backtrace_min_size")) {
        config.min_size = number;
    } else if (!strcmp(name, "backtrace_max_size")) {
        config.max_size = number;
    } else if (!strcmp(name, "backtrace_dump_on_exit")) {
        config.dump_on_exit = 1;
    } else if (!strcmp(name, "backtrace_dump_prefix")) {
        snprintf(config.prefix, sizeof config.prefix, "%s", *value ? value : DEFAULT_DUMP_PREFIX);  // fits: checked
    } else if (!strcmp(name, "backtrace_full")) {
        config.backtrace_full = 1;
    } else if (!strcmp(name, "leak_track")) {
        config.leak_track = config.track_allocs = 1;
    } else if (!strcmp(name, "front_guard") || !strcmp(name, "rear_guard") || !strcmp(name, "guard")) {
        if (strcmp(name, "rear_guard"))
            config.front_guard = guard_aligned(number);
        if (strcmp(name, "front_guard"))
            config.rear_guard = number;
        config.track_allocs = 1;
    } else if (!strcmp(name, "fill_on_alloc") || !strcmp(name, "fill_on_free") || !strcmp(name, "fill")) {
        if (strcmp(name, "fill_on_free"))
            config.fill_on_alloc = number;
        if (strcmp(name, "fill_on_alloc"))
            config.fill_on_free = number;
    } else if (!strcmp(name, "expand_alloc")) {
        config.expand = number;
    } else if (!strcmp(name, "free_track")) {
        config.free_track = number;
        config.track_allocs = 1;
        if (!config.fill_on_free)
            config.fill_on_free = SIZE_MAX;
        if (!config.free_track_frames)
            config.free_track_frames = 16;
    } else if (!strcmp(name, "free_track_backtrace_num_frames")) {
        config.free_track_frames = number;
    } else if (!strcmp(name, "verify_pointers")) {
        config.track_allocs = 1;
    } else if (!strcmp(name, "abort_on_error")) {
        config.abort_on_error = 1;
    }
}

static int apply(const struct option_spec *spec, const char *name, const char *value)
{
    size_t number = spec->default_number;
    if (spec->takes == TAKES_TEXT && strlen(value) >= PATH_MAX) {
        option_error("bad value for option '%s': %s", name, strerror(ENAMETOOLONG));
        return 0;
    }
    if (!spec->supported) {
        fprintf(stderr, "%s: option '%s' is not supported by leaktrace's library yet\n", program_invocation_short_name,
                spec->name);
        return 0;
    }
    if (spec->takes == TAKES_FLAG && *value) {
        option_error("value set for option '%s' which does not take a value%s", name, "");
        return 0;
    }
    if ((spec->takes == TAKES_SIZE || (spec->takes == TAKES_INT && *value)) &&
        !parse_number(name, value, spec, &number))
        return 0;
    set(spec->name, number, value);
    return 1;
}

static int is_space(char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r');
}

// parse_options with buffers each as long as the text.
static int parse_into(const char *text, char *name, char *value)
{
    config.max_size = SIZE_MAX;
    snprintf(config.prefix, sizeof config.prefix, "%s", DEFAULT_DUMP_PREFIX);
    const char *p = text;
    for (;;) {
        while (is_space(*p))
            p++;
        if (!*p)
            return 1;
        size_t n = 0;
        for (; *p && !is_space(*p) && *p != '='; p++)
            name[n++] = *p;
        name[n] = 0;
        while (is_space(*p))
            p++;
        size_t v = 0;
        if (*p == '=') {
            p++;
            while (is_space(*p))
                p++;
            for (; *p && !is_space(*p); p++)
                value[v++] = *p;
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

// Splits the string as bionic's Config::GetOption does; 0 on the first bad option. Names
// and values are whole however long, read into pages of their own (this library is not
// ready to record while it reads its options, and a chunk of glibc's heap freed here
// would be handed to the program with its address left on the stack).
int parse_options(const char *text)
{
    size_t room = strlen(text) + 1;
    char *name = mmap(NULL, 2 * room, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (name == MAP_FAILED)
        return 0;
    int good = parse_into(text, name, name + room);
    munmap(name, 2 * room);
    return good;
}
