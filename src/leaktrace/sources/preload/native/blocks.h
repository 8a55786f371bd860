// Blocks and the allocator-side options: headers, guards, fill, free_track (blocks.c).
#pragma once
#include "library.h"

void blocks_init(void);
void *block_alloc(size_t size, size_t alignment, int zeroed);  // header, guards, expand, fill
size_t block_usable_size(void *pointer);
int block_headers_on(void);  // guards: each block has the library's header before it
int block_valid(void *pointer, const char *function, int check_table);  // 0 after logging why not
void unknown_pointer(void *pointer, const char *function);              // bionic's UNKNOWN POINTER report
void block_release(void *pointer);                                      // guards checked, filled, held back or freed
void verify_all_freed(void);
void blocks_before_fork(void);
void blocks_after_fork(int child);
