// The preload library's table records, as leaktrace reads them from outside: the one source
// of truth for both sides (sources/bpf/layout_gen.py writes sources/preload/layout.py from it).
#ifndef LEAKTRACE_RECORD_H
#define LEAKTRACE_RECORD_H

#include <stddef.h>
#include <stdint.h>

#define MAX_FRAMES 256
#define RECORD_INHERITED 1u  // allocated before a fork, in the parent
#define RECORD_UNTRACED 2u   // made while stacks were switched off: not in leak info (bionic's hash index 0)

struct record {
    uintptr_t pointer;  // 0: empty slot; 1: deleted
    size_t size;
    uint32_t flags;  // RECORD_*
    uint32_t frame_count;
    uintptr_t *frames;  // pcs inside the call instruction, as bionic stores them
};

#endif
