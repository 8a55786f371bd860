// Stacks with libgcc's DWARF unwinder (no frame pointers needed), and their lines in the log.
#include "malloc_debug.h"

#include <errno.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <unwind.h>

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
        return _URC_NO_REASON;  // still inside this library
    if (pc >= 4096)
        pc -= 1;  // into the call instruction, as bionic adjusts it on x86
    state->frames[state->count++] = pc;
    return state->count >= state->max ? _URC_END_OF_STACK : _URC_NO_REASON;
}

size_t take_stack(uintptr_t *frames, size_t max)
{
    struct unwind_state state = {frames, 0, max};
    _Unwind_Backtrace(take_frame, &state);
    return state.count;
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
