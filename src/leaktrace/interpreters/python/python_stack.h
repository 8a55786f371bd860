// The preload library's walk of the allocating thread's Python frames (python_stack.c): what the
// library calls, and the code objects it writes out.
#ifndef LEAKTRACE_PYTHON_STACK_H
#define LEAKTRACE_PYTHON_STACK_H
#include <stddef.h>
#include <stdint.h>

#include "interpreter_host.h"  // struct kept_codes
#include "record.h"            // struct python_code_table

extern struct python_code_table *leaktrace_python_codes;  // the code objects Python frames named
void find_python(void);                                   // whether the program is a CPython of the version table
size_t python_stack(uintptr_t *words, size_t room);       // the thread's Python frames (up to 32), innermost first
struct kept_codes python_kept_codes(void);                // the code table, as kept (written at exit)

#endif
