// Generated from allocators/__init__.py by allocators/c_header.py; tests/unit/test_layouts.py checks it.
#ifndef LEAKTRACE_ALLOCATORS_H
#define LEAKTRACE_ALLOCATORS_H

// The allocator's entry points the library defines and an attach puts in every module's GOT.
#define ALLOCATOR_FUNCTIONS(X)                                                                                         \
    X(malloc)                                                                                                          \
    X(calloc)                                                                                                          \
    X(realloc)                                                                                                         \
    X(reallocarray)                                                                                                    \
    X(posix_memalign)                                                                                                  \
    X(aligned_alloc)                                                                                                   \
    X(memalign)                                                                                                        \
    X(valloc)                                                                                                          \
    X(pvalloc)                                                                                                         \
    X(free)

#endif
