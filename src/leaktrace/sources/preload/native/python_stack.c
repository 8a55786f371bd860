// The Python frames of the allocating thread, when the program is CPython 3.11: its own
// thread state (from the interpreter's key, so right while the thread has released the GIL),
// then the frames' chain, one word each (unwind/python_frames.h).
#include "malloc_debug.h"

#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "python_frames.h"

static uintptr_t (*this_thread_state)(void);  // PyGILState_GetThisThreadState; NULL: not CPython 3.11
EXPORT struct python_code_table
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
    return *(uint64_t *)(code + PY311_CODE_FILENAME) * 0x9e3779b97f4a7c15u ^
           *(uint64_t *)(code + PY311_CODE_QUALNAME) * 0xbf58476d1ce4e5b9u ^
           *(uint64_t *)(code + PY311_CODE_LINETABLE) ^ (uint64_t) * (uint32_t *)(code + PY311_CODE_FIRSTLINENO) << 32;
}

// Copies a str object's characters (PEP 393's compact forms) into the text; 0 if it is not one.
static uint32_t copy_string(uintptr_t text, char *into, size_t room, uint16_t *kind)
{
    int64_t length = *(int64_t *)(text + PY311_STR_LENGTH);
    uint32_t state = *(uint32_t *)(text + PY311_STR_STATE);
    uint32_t width = state >> 2 & 7, compact = state >> 5 & 1, ascii = state >> 6 & 1;
    if (!compact || (width != 1 && width != 2 && width != 4) || length < 0)
        return 0;
    size_t bytes = (size_t)(length < PYTHON_NAME_MOST ? length : PYTHON_NAME_MOST) * width;
    bytes = bytes < room ? bytes : room / width * width;
    memcpy(into, (const char *)text + (ascii ? PY311_STR_ASCII_DATA : PY311_STR_COMPACT_DATA), bytes);
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
    kept.first_line = *(uint32_t *)(code + PY311_CODE_FIRSTLINENO);
    kept.name_length = copy_string(*(uintptr_t *)(code + PY311_CODE_QUALNAME), text, room, &kept.name_kind);
    kept.file_length = copy_string(*(uintptr_t *)(code + PY311_CODE_FILENAME), text + kept.name_length,
                                   room - kept.name_length, &kept.file_kind);
    uintptr_t table = *(uintptr_t *)(code + PY311_CODE_LINETABLE);
    size_t used = kept.name_length + kept.file_length, length = (size_t) * (int64_t *)(table + PY311_BYTES_SIZE);
    length = length < PYTHON_TABLE_MOST ? length : PYTHON_TABLE_MOST;
    length = length < room - used ? length : room - used;
    memcpy(text + used, (const char *)table + PY311_BYTES_DATA, length);
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
    const char *name = code_type ? *(const char *const *)(code_type + PY311_TYPE_NAME) : NULL;
    const intptr_t *sizes = code_type ? (const intptr_t *)(code_type + PY311_TYPE_BASICSIZE) : NULL;
    if (version && state && *version >> 16 == PY311_VERSION && name && !strcmp(name, "code") &&
        sizes[0] == PY311_CODE_ADAPTIVE && sizes[1] == PY311_CODE_UNIT) {
        size_t size = sizeof(struct python_code_table) + PYTHON_CODES * sizeof(struct python_code) + PYTHON_TEXT;
        void *codes = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (codes == MAP_FAILED)
            return;
        leaktrace_python_codes = codes;
        this_thread_state = (uintptr_t(*)(void))state;
    }
}

size_t python_stack(uintptr_t *words, size_t room)
{
    if (!this_thread_state)
        return 0;
    size_t max = room < PYTHON_MAX_FRAMES ? room : PYTHON_MAX_FRAMES;
    uintptr_t thread = this_thread_state();  // NULL before the interpreter is up, and in threads it never saw
    uintptr_t cframe = thread ? *(uintptr_t *)(thread + PY311_TSTATE_CFRAME) : 0;
    uintptr_t frame = cframe ? *(uintptr_t *)(cframe + PY311_CFRAME_CURRENT_FRAME) : 0;
    size_t count = 0;
    for (; frame && count < max; frame = *(uintptr_t *)(frame + PY311_FRAME_PREVIOUS)) {
        uintptr_t code = *(uintptr_t *)(frame + PY311_FRAME_CODE);
        see_code(code);
        uintptr_t last = *(uintptr_t *)(frame + PY311_FRAME_PREV_INSTR);
        words[count++] = python_frame_word(code, last, *(uint8_t *)(frame + PY311_FRAME_IS_ENTRY));
    }
    if (frame)
        count_event(C_PYTHON_CUT);
    return count;
}
