// The stack walk of the BPF program: one frame per unwind_one, by the CFI row of its pc
// (unwind/tables.py compiles them from .eh_frame), else by the checked frame-pointer chain.
// Included by leaktrace.bpf.c after its maps, and by tests/unit/native/walk_replay.c, which
// runs the same walk in user space on recorded stacks. The includer provides struct
// pending_call (its walk, stack.walk and stack_copy), the maps unwind_rows and unwind_pages
// (lookup by index), read_user (bpf_probe_read_user), enum counter's C_TRUNCATED_* and
// STACK_DEPTH, PAGE_BYTES and UNWIND_DWARF.
#ifndef LEAKTRACE_WALK_BPF_H
#define LEAKTRACE_WALK_BPF_H

// The mapping of a process that holds pc, or none: the last frame's, else a short binary search.
static __always_inline struct exec_map *mapping_of(struct exec_maps *maps, struct walk_state *w, u64 pc)
{
    struct exec_map *m = &maps->map[w->last_map & (MAX_EXEC_MAPS - 1)];
    if (pc >= m->start && pc < m->end)
        return m;
    u32 lo = 0, hi = maps->count;
    if (hi > MAX_EXEC_MAPS)
        hi = MAX_EXEC_MAPS;
#pragma clang loop unroll(disable)
    for (u32 i = 0; i < 10 && lo < hi; i++) {  // 2^9 = MAX_EXEC_MAPS
        u32 mid = (lo + hi) / 2;
        m = &maps->map[mid & (MAX_EXEC_MAPS - 1)];
        if (pc < m->start) {
            hi = mid;
        } else if (pc >= m->end) {
            lo = mid + 1;
        } else {
            w->last_map = mid;
            return m;
        }
    }
    return 0;
}

// The rule for a module address: the last of the mapping's rows at or below it, searched
// among the rows of its page when the file has a page index.
static __always_inline struct unwind_row *row_for(struct exec_map *m, u64 vaddr)
{
#if UNWIND_DWARF
    if (!m->row_count || vaddr >> 32)
        return 0;
    u32 lo = m->first_row, hi = m->first_row + m->row_count;  // the answer is in [lo, hi)
    if (m->page_count) {
        // Below the origin, the last page: its rows all start above vaddr, which has none.
        u64 page = (vaddr - m->page_origin) >> (m->page_shift & 63);
        u32 at = m->first_page + (page < m->page_count ? page : m->page_count - 1);
        u64 *rows = unwind_pages.lookup(&at);
        if (rows)
            lo = m->first_row + (u32)*rows, hi = m->first_row + (u32)(*rows >> 32);
    }
#pragma clang loop unroll(disable)
    for (u32 i = 0; i < 22 && hi - lo > 1; i++) {  // 2^21 rows: the most a module can have
        u32 mid = lo + (hi - lo) / 2;
        struct unwind_row *row = unwind_rows.lookup(&mid);
        if (!row)
            return 0;
        if (row->pc <= (u32)vaddr)
            lo = mid;
        else
            hi = mid;
    }
    struct unwind_row *row = unwind_rows.lookup(&lo);
    return row && row->pc <= (u32)vaddr ? row : 0;
#else
    return 0;
#endif
}

// Copies the window of the stack that starts at addr; returns its size (0: none). The whole
// window, else up to the end of addr's page (mapped, since addr's word is part of the stack).
static __always_inline u32 copy_window(struct pending_call *call, u64 addr)
{
    if (read_user(call->stack_copy, STACK_COPY, (void *)addr) == 0)
        return STACK_COPY;
    u32 size = PAGE_BYTES - (addr & (PAGE_BYTES - 1));
    if (size > STACK_COPY)
        size = STACK_COPY;
    if (size < 16 || read_user(call->stack_copy, size, (void *)addr) != 0)
        return 0;
    return size;
}

// Two words of the target's stack at addr, through the window.
static __always_inline long read_stack(struct pending_call *call, u64 *words, u64 addr)
{
    struct walk_state *w = &call->walk;
    u64 at = addr - w->copy_base;
    if (w->copied >= 16 && at > w->copied - 16 && addr > w->copy_base) {
        // Past the window, up the stack: the next window starts here.
        w->copy_base = addr, at = 0;
        w->copied = copy_window(call, addr);
    }
    if (w->copied >= 16 && at <= w->copied - 16 && at <= STACK_COPY - 16) {
        words[0] = *(u64 *)&call->stack_copy[at];
        words[1] = *(u64 *)&call->stack_copy[at + 8];
        return 0;
    }
    return read_user(words, 16, (void *)addr);
}

static __always_inline void truncate_walk(struct walk_state *w, u32 why)
{
    w->end = WALK_TRUNCATED;
    w->why = why;
}

// One frame: records w->pc if it is a return address into executable mapped code,
// then finds the caller's pc, sp and rbp (by the row's rule, else by the
// frame-pointer chain, whose return address the next step checks the same way).
static __always_inline void unwind_one(struct pending_call *call, struct exec_maps *maps)
{
    struct walk_state *w = &call->walk;
    struct stack_val *out = &call->stack.walk;
    u32 depth = w->depth;
    if (depth >= STACK_DEPTH) {
        w->end = WALK_COMPLETE;
        return;
    }
    struct exec_map *m = maps ? mapping_of(maps, w, w->pc) : 0;
    if (!m) {
        // Frame 0 is the return address the kernel put back: known good even without maps.
        if (depth == 0)
            out->ip[0] = w->pc, w->depth = 1;
        if (depth == 0 && STACK_DEPTH == 1)
            w->end = WALK_COMPLETE;
        else
            truncate_walk(w, w->fp_ended ? C_TRUNCATED_NO_RULE
                             : maps      ? C_TRUNCATED_UNKNOWN_CODE
                                         : C_TRUNCATED_NO_TABLES);
        return;
    }
    // A return address follows its call: the call's own rule is the one just before it.
    struct unwind_row *row = row_for(m, w->pc - ARCH_CALL_SITE_BACK - m->bias);
    u8 rule = row ? row->cfa_rule : CFA_UNKNOWN;
    if (w->fp_ended && rule != CFA_RSP && rule != CFA_END) {
        truncate_walk(w, C_TRUNCATED_NO_RULE);
        return;
    }
    w->fp_ended = 0;
    out->ip[depth] = w->pc;
    w->depth = depth + 1;
    if (depth + 1 >= STACK_DEPTH) {  // the frame limit: the stack is whole as asked
        w->end = WALK_COMPLETE;
        return;
    }
    if (rule == CFA_END) {
        w->end = WALK_COMPLETE;
        return;
    }
    if (rule == CFA_SIGNAL) {
        // rt_sigframe: sp is at the ucontext; its mcontext (offset 40) holds rbp, ..., rsp, rip
        // as gregs 10 and 15, 16.
        u64 regs[7] = {};
        if (read_user(regs, sizeof(regs), (void *)(w->sp + 40 + 10 * 8)) != 0) {
            truncate_walk(w, C_TRUNCATED_UNREADABLE_STACK);
            return;
        }
        if (regs[5] <= w->sp) {
            truncate_walk(w, C_TRUNCATED_BAD_FRAME);
            return;
        }
        w->bp = regs[0], w->sp = regs[5], w->pc = regs[6];
        return;
    }
    if (rule == CFA_RSP || rule == CFA_RBP) {
        u64 cfa = (rule == CFA_RSP ? w->sp : w->bp) + row->cfa_offset;
        u64 frame[2] = {};  // [0]: the word below the return address, [1]: the return address
        if (cfa <= w->sp) {
            truncate_walk(w, C_TRUNCATED_BAD_FRAME);
            return;
        }
        if (read_stack(call, frame, cfa - 16) != 0) {
            truncate_walk(w, C_TRUNCATED_UNREADABLE_STACK);
            return;
        }
        if (row->rbp_rule == RBP_SAVED) {
            u64 saved[2] = {};
            if (row->rbp_offset == -16)
                w->bp = frame[0];
            else if (read_stack(call, saved, cfa + row->rbp_offset) == 0)
                w->bp = saved[0];
            else
                truncate_walk(w, C_TRUNCATED_UNREADABLE_STACK);
        }
        w->pc = frame[1], w->sp = cfa;
    } else {
        // No rule here: the frame-pointer chain, if rbp points into the stack at or above sp. A
        // saved rbp not above it ends the chain (a caller without frame pointers: libc's
        // __libc_start_call_main and start_thread under chromium's main and threads).
        u64 frame[2] = {};  // the saved frame pointer, then the return address
        if (!w->bp) {
            w->end = WALK_COMPLETE;  // the ABI's mark of the outermost frame (ld.so's _dl_start_user)
            return;
        }
        if (w->bp < w->sp || read_stack(call, frame, w->bp) != 0) {
            truncate_walk(w, C_TRUNCATED_NO_RULE);
            return;
        }
        // A saved frame pointer of 0 is the outermost frame's mark: its return address is the last.
        w->fp_ended = frame[0] && frame[0] <= w->bp;
        w->sp = w->bp + 16, w->pc = frame[1], w->bp = frame[0];
    }
    if (!w->pc)
        w->end = WALK_COMPLETE;  // a zero return address ends a stack
}

#endif
