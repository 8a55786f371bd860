// The preload library's walk of the allocating thread's Python frames (python_walk.bpf.h is
// the BPF engine's), when the program is a CPython of the version table (python_versions.h; 3.13
// on, its _Py_DebugOffsets): its own thread state (from the interpreter's key, so right while
// the thread has released the GIL), then the frames' chain, one word each (python_frames.h).
#define _GNU_SOURCE
#include "interpreter_host.h"  // the one thing this walk asks of the library: count_event

#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "python_frames.h"
#include "python_stack.h"
#include "python_versions.h"

// Readable memory of the process as /proc/self/maps listed it at the last look: every read of
// the walk is checked against it first, so a program that only looks like CPython (its words
// pointing anywhere) cannot make the walk fault. A miss looks again (a real interpreter misses
// only after it has mapped more memory); a read still outside it ends the walk there (counted
// as a cut stack).
#define READABLE_MOST 8192
#define MAPS_CHUNK 65536
struct span {
    uintptr_t start, end;
};
struct spans {
    size_t count;
    struct span span[READABLE_MOST];
};
static struct spans *spans_buffers;  // two, mmapped: one read while the other is filled
static struct spans *current_spans;
// The span the last check of each kind of object found: most reads of a kind fall in it again.
enum span_hint { HINT_FRAME, HINT_CODE, HINT_OTHER, HINTS };
static size_t span_hints[HINTS];
static int looking;  // one look at a time

static uintptr_t hex_field(const char **at, const char *end)
{
    uintptr_t value = 0;
    for (; *at < end; (*at)++) {
        char c = **at;
        int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (digit < 0)
            break;
        value = value << 4 | (uintptr_t)digit;
    }
    return value;
}

// One line of maps ("start-end perms ..."): its span when readable.
static void add_line(struct spans *into, const char *line, const char *end)
{
    uintptr_t start = hex_field(&line, end);
    if (line >= end || *line++ != '-')
        return;
    uintptr_t stop = hex_field(&line, end);
    if (line + 1 >= end || line[1] != 'r' || stop <= start)
        return;
    if (into->count && into->span[into->count - 1].end == start)
        into->span[into->count - 1].end = stop;  // adjacent: one span
    else if (into->count < READABLE_MOST)
        into->span[into->count++] = (struct span){start, stop};
}

// Reads /proc/self/maps into the buffer not in use and makes it current (no allocation).
static void look_at_maps(void)
{
    if (__atomic_exchange_n(&looking, 1, __ATOMIC_ACQUIRE)) {
        while (__atomic_load_n(&looking, __ATOMIC_ACQUIRE))
            ;  // another thread's look, as fresh as one of ours
        return;
    }
    struct spans *into = current_spans == spans_buffers ? spans_buffers + 1 : spans_buffers;
    char *chunk = (char *)(spans_buffers + 2);
    into->count = 0;
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    size_t kept = 0;
    ssize_t got;
    while (fd >= 0 && (got = read(fd, chunk + kept, MAPS_CHUNK - kept)) > 0) {
        const char *line = chunk, *end = chunk + kept + got, *newline;
        while ((newline = memchr(line, '\n', (size_t)(end - line)))) {
            add_line(into, line, newline);
            line = newline + 1;
        }
        kept = (size_t)(end - line);
        memmove(chunk, line, kept);
        if (kept == MAPS_CHUNK)
            kept = 0;  // a line longer than the chunk: dropped
    }
    if (fd >= 0)
        close(fd);
    __atomic_store_n(&current_spans, into, __ATOMIC_RELEASE);
    __atomic_store_n(&looking, 0, __ATOMIC_RELEASE);
}

static int in_spans(const struct spans *spans, uintptr_t start, uintptr_t end, size_t *hinted)
{
    size_t hint = __atomic_load_n(hinted, __ATOMIC_RELAXED);
    if (hint < spans->count && spans->span[hint].start <= start && end <= spans->span[hint].end)
        return 1;
    size_t low = 0, high = spans->count;
    while (low < high) {
        size_t middle = (low + high) / 2;
        if (spans->span[middle].end <= start)
            low = middle + 1;
        else
            high = middle;
    }
    if (low < spans->count && spans->span[low].start <= start && end <= spans->span[low].end) {
        __atomic_store_n(hinted, low, __ATOMIC_RELAXED);
        return 1;
    }
    return 0;
}

// Whether [address, address + length) lies in one readable span (looked for again on a miss).
static int readable_as(uintptr_t address, size_t length, enum span_hint kind)
{
    uintptr_t end = address + length;
    if (end < address || !address)
        return 0;
    const struct spans *spans = __atomic_load_n(&current_spans, __ATOMIC_ACQUIRE);
    if (spans && in_spans(spans, address, end, &span_hints[kind]))
        return 1;
    look_at_maps();
    spans = __atomic_load_n(&current_spans, __ATOMIC_ACQUIRE);
    return spans && in_spans(spans, address, end, &span_hints[kind]);
}

static int readable(uintptr_t address, size_t length)
{
    return readable_as(address, length, HINT_OTHER);
}

static uintptr_t (*this_thread_state)(void);  // PyGILState_GetThisThreadState; NULL: not a CPython walked
static struct python_offsets row;             // where that CPython keeps what the walk reads
__attribute__((visibility("default"))) struct python_code_table
    *leaktrace_python_codes;  // the code objects seen (record.h), once the program is CPython

static struct python_code *code_slots(void)
{
    return (struct python_code *)(leaktrace_python_codes + 1);
}

static char *code_text(void)
{
    return (char *)(code_slots() + PYTHON_CODES);
}

// What tells one code object from another at the same address.
static uint64_t code_fields(uintptr_t code)
{
    return *(uint64_t *)(code + row.code_filename) * 0x9e3779b97f4a7c15u ^
           *(uint64_t *)(code + row.code_qualname) * 0xbf58476d1ce4e5b9u ^ *(uint64_t *)(code + row.code_linetable) ^
           (uint64_t) * (uint32_t *)(code + row.code_first_line) << 32;
}

// Copies a str object's characters (PEP 393's compact forms) into the text; 0 if it is not one.
static uint32_t copy_string(uintptr_t text, char *into, size_t room, uint16_t *kind)
{
    if (!readable(text, row.str_compact_data))
        return 0;
    int64_t length = *(int64_t *)(text + PYTHON_STR_LENGTH);
    uint32_t state = *(uint32_t *)(text + PYTHON_STR_STATE);
    uint32_t width = state >> 2 & 7, compact = state >> 5 & 1, ascii = state >> 6 & 1;
    if (!compact || (width != 1 && width != 2 && width != 4) || length < 0)
        return 0;
    size_t bytes = (size_t)(length < PYTHON_NAME_MOST ? length : PYTHON_NAME_MOST) * width;
    bytes = bytes < room ? bytes : room / width * width;
    uintptr_t data = text + (ascii ? row.str_ascii_data : row.str_compact_data);
    if (!readable(data, bytes))
        return 0;
    memcpy(into, (const char *)data, bytes);
    *kind = (uint16_t)width;
    return (uint32_t)bytes;
}

// Keeps a code object seen for the first time: its qualname, file name, first line and line
// table (the thread that runs it is here: every field is in place). Under the lock.
static void keep_code(struct python_code *slot, uintptr_t code, uint64_t fields)
{
    struct python_code_table *codes = leaktrace_python_codes;
    char *text = code_text() + codes->text_used;
    size_t room = PYTHON_TEXT - codes->text_used;
    struct python_code kept = {.fields = fields, .text = codes->text_used};
    kept.first_line = *(uint32_t *)(code + row.code_first_line);
    kept.name_length = copy_string(*(uintptr_t *)(code + row.code_qualname), text, room, &kept.name_kind);
    kept.file_length = copy_string(*(uintptr_t *)(code + row.code_filename), text + kept.name_length,
                                   room - kept.name_length, &kept.file_kind);
    uintptr_t table = *(uintptr_t *)(code + row.code_linetable);
    size_t used = kept.name_length + kept.file_length, length = 0;
    if (readable(table, PYTHON_BYTES_DATA)) {
        length = (size_t) * (int64_t *)(table + PYTHON_BYTES_SIZE);
        length = length < PYTHON_TABLE_MOST ? length : PYTHON_TABLE_MOST;
        length = length < room - used ? length : room - used;
        length = readable(table + PYTHON_BYTES_DATA, length) ? length : 0;
    }
    memcpy(text + used, (const char *)table + PYTHON_BYTES_DATA, length);
    kept.table_length = (uint32_t)length;
    codes->text_used += used + length;
    *slot = kept;
    __atomic_store_n(&slot->code, (uint64_t)code, __ATOMIC_RELEASE);  // found by lookups from here on
    codes->count++;
}

// Room for one more code object: slots three quarters full at most, and its longest text.
static int room_for_code(const struct python_code_table *codes)
{
    return codes->count < PYTHON_CODES / 4 * 3 &&
           codes->text_used + 2 * 4 * PYTHON_NAME_MOST + PYTHON_TABLE_MOST <= PYTHON_TEXT;
}

// The code object at code, kept the first time it is seen (counted where there is no room);
// one whose fields differ from those kept at its address marks the slot changed.
static void see_code(uintptr_t code)
{
    uint64_t fields = code_fields(code);
    size_t at = (size_t)((code >> 4) * 0x9e3779b97f4a7c15u >> 52) & (PYTHON_CODES - 1);
    struct python_code *slots = code_slots();
    for (size_t probe = 0; probe < PYTHON_CODES;) {
        uint64_t there = __atomic_load_n(&slots[at].code, __ATOMIC_ACQUIRE);
        if (there == code) {
            if (slots[at].fields != fields && !slots[at].changed)
                __atomic_store_n(&slots[at].changed, 1, __ATOMIC_RELAXED);
            return;
        }
        if (there) {
            at = (at + 1) & (PYTHON_CODES - 1), probe++;
            continue;
        }
        struct python_code_table *codes = leaktrace_python_codes;
        while (__atomic_exchange_n(&codes->lock, 1, __ATOMIC_ACQUIRE))
            ;
        int empty = !slots[at].code, kept = empty && room_for_code(codes);
        if (kept)
            keep_code(&slots[at], code, fields);
        __atomic_store_n(&codes->lock, 0, __ATOMIC_RELEASE);
        if (kept)
            return;
        if (empty) {
            count_event(C_PYTHON_CODES_FULL);
            return;
        }
        // Another thread filled the slot meanwhile: the loop looks at it again.
    }
    count_event(C_PYTHON_CODES_FULL);
}

// A module named libpython*: an interpreter embedded in another program.
static int is_libpython(struct dl_phdr_info *info, size_t size, void *unused)
{
    (void)size, (void)unused;
    const char *slash = strrchr(info->dlpi_name, '/');
    return !strncmp(slash ? slash + 1 : info->dlpi_name, "libpython", 9);
}

// Whether a CPython may be in this process, asked before dlsym: a symbol dlsym does not find
// leaves libc's error message on the heap, a block no program of ours made.
static int may_be_python(void)
{
    char program[PATH_MAX];
    ssize_t length = readlink("/proc/self/exe", program, sizeof program - 1);
    program[length > 0 ? length : 0] = 0;
    const char *slash = strrchr(program, '/');
    return !strncmp(slash ? slash + 1 : program, "python", 6) || dl_iterate_phdr(is_libpython, NULL);
}

// The row of the CPython whose Py_Version is version: the table's, else (3.13 on) the one its
// _Py_DebugOffsets gives (dlsym asked only then: _PyRuntime is not exported by every 3.11);
// 0 for a version, or a layout, the walk does not know.
static int row_of(unsigned long version, struct python_offsets *into)
{
    for (size_t i = 0; i < PYTHON_ROWS; i++)
        if (python_rows[i].version == version >> 16) {
            *into = python_rows[i];
            return 1;
        }
    const unsigned long known[] = PYTHON_DEBUG_VERSIONS;
    int layout_known = 0;
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        layout_known |= known[i] == version >> 16;
    const uint64_t *debug = layout_known ? dlsym(RTLD_DEFAULT, "_PyRuntime") : NULL;
    if (!debug || memcmp(debug, PYTHON_DEBUG_COOKIE, 8) || debug[PYTHON_DEBUG_VERSION_WORD] != version ||
        debug[PYTHON_DEBUG_FREE_THREADED_WORD])
        return 0;
    for (size_t i = 0; i < sizeof python_debug_checks / sizeof *python_debug_checks; i++)
        if (debug[python_debug_checks[i][0]] != python_debug_checks[i][1])
            return 0;
    uint32_t *field = (uint32_t *)into;
    for (size_t i = 0; i < sizeof(struct python_offsets) / sizeof(uint32_t); i++)
        field[i] =
            (uint32_t)((python_debug_words[i] >= 0 ? debug[python_debug_words[i]] : 0) + python_debug_addends[i]);
    into->version = (uint32_t)(version >> 16);
    return 1;
}

// Whether a row's frame fields lie in the head the walk checks is readable (versions.py's sound).
static int sound(const struct python_offsets *offsets)
{
    return offsets->frame_code <= PYTHON_FRAME_HEAD - 8 && offsets->frame_previous <= PYTHON_FRAME_HEAD - 8 &&
           offsets->frame_instruction <= PYTHON_FRAME_HEAD - 8 && offsets->frame_entry < PYTHON_FRAME_HEAD;
}

void find_python(void)
{
    if (this_thread_state)
        return;  // an attach after a detach: found, and its codes kept, already
    const char *wanted = getenv("LEAKTRACE_PYTHON_FRAMES");  // "no": native frames only
    if ((wanted && !strcmp(wanted, "no")) || !may_be_python())
        return;
    const unsigned long *version = dlsym(RTLD_DEFAULT, "Py_Version");
    const char *code_type = dlsym(RTLD_DEFAULT, "PyCode_Type");
    void *state = dlsym(RTLD_DEFAULT, "PyGILState_GetThisThreadState");
    const char *name = code_type ? *(const char *const *)(code_type + PYTHON_TYPE_NAME) : NULL;
    const intptr_t *sizes = code_type ? (const intptr_t *)(code_type + PYTHON_TYPE_BASICSIZE) : NULL;
    struct python_offsets found;
    if (version && state && name && !strcmp(name, "code") && row_of(*version, &found) && sound(&found) &&
        sizes[0] == found.code_instructions && sizes[1] == PYTHON_CODE_UNIT) {
        size_t size = sizeof(struct python_code_table) + PYTHON_CODES * sizeof(struct python_code) + PYTHON_TEXT;
        void *codes = map_own(size);
        size_t spans_size = 2 * sizeof(struct spans) + MAPS_CHUNK;
        void *spans = mmap(NULL, spans_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (codes == MAP_FAILED || spans == MAP_FAILED) {
            if (codes != MAP_FAILED)
                unmap_own(codes, size);
            if (spans != MAP_FAILED)
                munmap(spans, spans_size);
            return;
        }
        spans_buffers = spans;
        look_at_maps();
        leaktrace_python_codes = codes;
        row = found;
        this_thread_state = (uintptr_t(*)(void))state;
    }
}

size_t python_stack(uintptr_t *words, size_t room)
{
    if (!this_thread_state)
        return 0;
    size_t max = room < PYTHON_MAX_FRAMES ? room : PYTHON_MAX_FRAMES;
    uintptr_t thread = this_thread_state();  // NULL before the interpreter is up, and in threads it never saw
    uintptr_t frame = thread && readable(thread + row.tstate_frame, 8) ? *(uintptr_t *)(thread + row.tstate_frame) : 0;
    if (frame && row.cframe_frame != PYTHON_NO_CFRAME)
        frame = readable(frame + row.cframe_frame, 8) ? *(uintptr_t *)(frame + row.cframe_frame) : 0;
    size_t count = 0;
    // Bounded as the BPF walk is: a shim frame adds no word, so a chain of shims that leads back
    // to itself (a hostile program's) would otherwise never end, inside the program's malloc.
    for (size_t steps = 0; frame && steps < 2 * PYTHON_MAX_FRAMES + 1; steps++) {
        if (!readable_as(frame, PYTHON_FRAME_HEAD, HINT_FRAME))
            break;  // not a frame: counted as cut below
        uint8_t entry = *(uint8_t *)(frame + row.frame_entry);
        uintptr_t previous = *(uintptr_t *)(frame + row.frame_previous);
        if (row.shim_owner && entry == row.shim_owner) {  // the eval loop's own: the frame before it began a run
            if (count)
                words[count - 1] |= PYTHON_FRAME_ENTRY;
            frame = previous;
            continue;
        }
        if (count == max)
            break;
        uintptr_t code = *(uintptr_t *)(frame + row.frame_code);
        if (!readable_as(code, row.code_instructions, HINT_CODE))
            break;
        see_code(code);
        uintptr_t last = *(uintptr_t *)(frame + row.frame_instruction);
        words[count++] = python_frame_word(code, last, row.code_instructions, !row.shim_owner && entry);
        frame = previous;
    }
    if (frame)
        count_event(C_PYTHON_CUT);
    return count;
}

struct kept_codes python_kept_codes(void)
{
    struct python_code_table *codes = leaktrace_python_codes;
    if (!codes)
        return (struct kept_codes){0};
    size_t head = sizeof *codes + PYTHON_CODES * sizeof(struct python_code);
    return (struct kept_codes){codes, head + codes->text_used, ".exit.python", "Python code objects"};
}
