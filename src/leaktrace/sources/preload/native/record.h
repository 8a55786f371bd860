// The preload library's table records, as leaktrace reads them from outside: the one source
// of truth for both sides (sources/bpf/layout_gen.py writes sources/preload/layout.py from it).
#ifndef LEAKTRACE_RECORD_H
#define LEAKTRACE_RECORD_H

#include <stddef.h>
#include <stdint.h>

#define MAX_FRAMES 256
#define RECORD_INHERITED 1u  // allocated before a fork, in the parent
#define RECORD_UNTRACED 2u   // made while stacks were switched off: not in leak info (bionic's hash index 0)
#define TABLE_SHARDS 16      // the table's parts, each behind its own lock; the 64 MiB a pointer is in picks one

struct record {
    uintptr_t pointer;  // 0: empty slot; 1: deleted
    size_t size;
    uint32_t flags;  // RECORD_*
    uint32_t frame_count;
    uintptr_t *frames;  // pcs inside the call instruction, as bionic stores them
};

// One part of the table (leaktrace_shards[TABLE_SHARDS]), changed only under its lock: a
// reader that stops the process finds it consistent when the lock is zero.
struct table_shard {
    uint32_t lock;           // 0: free; 1: held
    uint32_t unused;         // keeps records at offset 8
    struct record *records;  // open addressing keyed by the program's pointer
    size_t slots;            // a power of two; 0 before its first block
    size_t used;             // slots not empty: live or deleted
    size_t live;
    uint64_t allocations;  // blocks recorded here, counted under the lock
    uint64_t frees;        // and taken out
    char pad[72];          // to 128 bytes: two shards never share a cache line
};

#endif
