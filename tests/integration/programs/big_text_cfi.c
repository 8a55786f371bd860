// The part of big_text built with unwind tables and no frame pointer, linked after its padding.
#include <stddef.h>

__attribute__((noinline)) void *through_cfi(size_t size, void *(*allocate)(size_t))
{
    void *block = allocate(size);
    __asm__ volatile("" ::: "memory");
    return block;
}
