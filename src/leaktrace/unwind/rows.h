// The unwinder's layout, shared by the BPF walk (walk.bpf.h), the preload library's walk and
// the CFI interpreter (cfi.c), and user space (rows.py, which layout_gen.py writes from this
// file): a module's unwind rows, a process's executable mappings and their page index.
// Kept to what layout_gen.py reads: #define NAME NUMBER and structs of u8/s16/u32/s32/u64.
#ifndef LEAKTRACE_UNWIND_ROWS_H
#define LEAKTRACE_UNWIND_ROWS_H

// How to find the caller's frame from a range of a module's code (unwind/tables.py
// compiles them from .eh_frame): the CFA is rsp or rbp plus cfa_offset, the return
// address sits at CFA-8, and the caller's rbp at CFA+rbp_offset when saved.
struct unwind_row {
    u32 pc;  // module virtual address where the rule starts
    s32 cfa_offset;
    s16 rbp_offset;
    u8 cfa_rule;  // CFA_*
    u8 rbp_rule;  // RBP_*
};
// A row of a module file's .eh_frame as cfi.c compiles it for unwind/tables.py: the rule in
// force from pc on, within the FDE [fde_start, fde_end).
struct cfi_section_row {
    u64 fde_start;
    u64 fde_end;
    u64 pc;
    s32 cfa_offset;
    s16 rbp_offset;
    u8 cfa_rule;  // CFA_*
    u8 rbp_rule;  // RBP_*
};
#define CFA_UNKNOWN 0  // no rule the walk can apply: try the frame-pointer chain
#define CFA_RSP 1
#define CFA_RBP 2
#define CFA_END 3     // the return address is undefined: the outermost frame
#define CFA_SIGNAL 4  // a signal trampoline: the registers are in the ucontext at rsp
#define RBP_SAME 0
#define RBP_SAVED 1

struct exec_map {
    u64 start;
    u64 end;
    u64 bias;  // address - module virtual address
    u32 first_row;
    u32 row_count;  // 0: no table (the frame-pointer chain, checked, is tried)
    u32 first_page;
    u32 page_count;   // 0: no page index (the search covers every row of the file)
    u32 page_origin;  // module virtual address of page 0
    u32 page_shift;   // its pages are 2^page_shift bytes of code
};
#define ROW_PAGE_SHIFT 9      // the smallest page: 512 bytes of code
#define MAX_FILE_PAGES 65536  // a larger module gets larger pages (chromium's 225 MiB: 4 KiB)
#define MAX_EXEC_MAPS 512     // a power of two: mapping_of in walk.bpf.h masks with it

#endif
