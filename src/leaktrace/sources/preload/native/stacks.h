// Stacks, and the log on stderr (stacks.c).
#pragma once
#include "library.h"

void find_own_code(void);
size_t take_stack(uintptr_t *frames, size_t max);  // the caller's stack, this library left out
void choose_unwinder(void);                        // LEAKTRACE_UNWINDER=libgcc: libgcc's walk for every stack
unsigned long stacks_walked_by_libgcc(void);       // stacks with a frame the rules could not follow
uintptr_t *copy_frames(const uintptr_t *frames, size_t count);

// One line per frame, as malloc_debug's backtrace_string; names NULL: looked up for this call alone.
struct frame_names;
void log_backtrace(struct frame_names *names, const uintptr_t *frames, size_t count);
void write_all(int fd, const char *text, size_t length);  // retried on EINTR and short writes
void log_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
