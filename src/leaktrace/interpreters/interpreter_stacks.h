// What the preload library calls of the interpreters' walks (interpreters/table.py's rows), and
// the one header of interpreters/ it includes: each interpreter found once, a stack's
// interpreter frames after its native ones, and the code objects each keeps.
#ifndef LEAKTRACE_INTERPRETER_STACKS_H
#define LEAKTRACE_INTERPRETER_STACKS_H
#include "interpreter_host.h"  // struct kept_codes
#include "python_stack.h"      // CPython's walk (interpreters/python/)

#define INTERPRETER_COUNT 1

static inline void find_interpreters(void)
{
    find_python();
}

// The thread's interpreter frames, innermost first, in up to room words.
static inline size_t interpreter_stack(uintptr_t *words, size_t room)
{
    return python_stack(words, room);
}

// The code objects interpreter which (below INTERPRETER_COUNT) keeps.
static inline struct kept_codes interpreter_kept_codes(int which)
{
    return which == 0 ? python_kept_codes() : (struct kept_codes){0};
}

#endif
