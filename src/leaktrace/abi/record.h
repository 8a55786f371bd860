// The preload library's table records, as leaktrace reads them from outside: the one source
// of truth for both sides (abi/layout_gen.py writes abi/record.py from it).
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
    uintptr_t *frames;  // pcs inside the call instruction, as bionic stores them (its site's)
    struct site *site;  // NULL: counted in no site (none could be made)
};

// A (size, stack) the program allocated at (sites.c): this header, then SITE_SLOTS struct
// site_counts (a thread counts in the slot of its ordinal, so that threads at one site seldom
// share a lock or a line), then its frames. Its counts are the sums over the slots'.
#define SITE_SLOTS 4
struct site {
    uint32_t frame_count;
    uint32_t unused;
    uint64_t hash;  // of size and frames
    size_t size;
    uintptr_t *frames;
    char pad[32];  // to 64 bytes: the slots start on a line of their own
};

// A slot's counts: the BPF engine's struct site_val, field for field, under the slot's lock.
struct site_counts {
    uint32_t lock;  // 0: free; 1: held, while its counts change
    uint32_t unused;
    int64_t live;  // blocks live now
    uint64_t allocations;
    uint64_t frees;
    uint64_t short_lived;  // freed by the thread's next allocator call after it made them
    int64_t peak_live;     // blocks live at the peak of epoch peak_epoch (leaktrace_peak)
    uint64_t peak_epoch;
    char pad[8];  // to 64 bytes
};

#define SITE_SHARDS 16
#define SHARD_SITES_MOST 262144  // sites a shard makes (4 Mi in all); past them a block is not recorded
// One part of the site table (leaktrace_site_shards[SITE_SHARDS]), found by a site's hash:
// open addressing of pointers to sites, changed under its lock.
struct site_shard {
    uint32_t lock;
    uint32_t unused;
    struct site **slots;  // mmapped; NULL: empty slot
    size_t slot_count;    // a power of two; 0 before its first site
    size_t used;
    char pad[32];  // to 64 bytes
};

// The mappings the library made for memory of its own that holds the program's addresses (the
// sites, their slots, the Python code table): leaktrace_own_maps[OWN_MAPS], read in place, so
// that a reachability check never takes them for the program's roots.
#define OWN_MAPS 256
struct own_map {
    uint64_t start;  // 0: an unused entry
    uint64_t end;
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

// The code objects of a CPython 3.11 program, kept by the library the first time a Python
// frame names each (leaktrace_python_codes, mapped then): the interpreter frees them at its
// exit, before leaktrace reads its last table. A struct python_code_table, then PYTHON_CODES slots
// (open addressing by code address), then PYTHON_TEXT bytes of names, files and line tables.
#define PYTHON_CODES 4096
#define PYTHON_TEXT 0x100000
#define PYTHON_TABLE_MOST 0x4000  // bytes of a line table kept

struct python_code_table {
    uint32_t lock;       // 0: free; 1: held (a reader that stops the process waits for 0)
    uint32_t count;      // slots used
    uint64_t text_used;  // bytes of text used
};

struct python_code {
    uint64_t code;    // its address; 0: an empty slot
    uint64_t fields;  // its fields' checksum: another code object at the address has others
    uint64_t text;    // where its qualname, then its file name, then its line table start in the text
    uint32_t first_line;
    uint32_t changed;      // the address has held another code object since
    uint32_t name_length;  // bytes of each
    uint32_t file_length;
    uint32_t table_length;
    uint16_t name_kind;  // bytes a character (PEP 393: 1, 2 or 4)
    uint16_t file_kind;
};

#endif
