// The BPF engine's walk of the calling thread's Python frames (python_stack.c is the library's),
// after its native ones, by its interpreter's row (struct python_offsets): included by
// interpreter_walks.bpf.h, where call, read_user and count are.

BPF_HASH(python_procs, u32, struct python_proc, MAX_PROCS);  // tgid -> its CPython's thread-state key and row

// Copies the window that ends at the head of the Python frame at frame into stack_copy (which
// the native walk is done with): STACK_COPY bytes, else those from the start of its page;
// returns its size (0: none). One thread's frames sit below each other in its data stack, so
// one window holds several; a generator's frame lies in its object, and gets one of its own.
static __always_inline u32 python_window(struct pending_call *call, u64 frame)
{
    u64 end = frame + PYTHON_FRAME_HEAD;
    if (read_user(call->stack_copy, STACK_COPY, (void *)(end - STACK_COPY)) == 0)
        return STACK_COPY;
    u64 reach = end - (frame & ~(u64)(PAGE_BYTES - 1));
    u32 size = reach < STACK_COPY ? (u32)reach : STACK_COPY;
    if (size < PYTHON_FRAME_HEAD || read_user(call->stack_copy, size, (void *)(end - size)) != 0)
        return 0;
    return size;
}

// The thread's current frame: its own thread state from the interpreter's key in the thread's
// TLS (glibc's first block of keys), so right while the thread has released the GIL; 0: none.
static __always_inline u64 python_current_frame(struct python_proc *python)
{
    u32 key[2];  // made, then the key
    u64 fsbase = 0, thread = 0, frame = 0;
    if (read_user(key, sizeof(key), (void *)(python->key_address - 4)) || key[0] != 1 ||
        key[1] >= GLIBC_SPECIFIC_FIRST_KEYS)
        return 0;
    bpf_probe_read_kernel(&fsbase, sizeof(fsbase), (void *)(bpf_get_current_task() + TASK_FSBASE));
    u64 slot = fsbase + GLIBC_SPECIFIC_FIRST + key[1] * GLIBC_SPECIFIC_SLOT + GLIBC_SPECIFIC_DATA;
    if (!fsbase || read_user(&thread, 8, (void *)slot) || !thread ||
        read_user(&frame, 8, (void *)(thread + python->offsets.tstate_frame)) || !frame)
        return 0;
    u32 cframe_frame = python->offsets.cframe_frame;
    if (cframe_frame != PYTHON_NO_CFRAME && read_user(&frame, 8, (void *)(frame + cframe_frame)))
        return 0;
    return frame;
}

// The frames' chain through windows, a word each, innermost first; an eval loop's shim frame
// (3.12 on) is PYTHON_SHIM_WORD, which user space folds into the frame before it (frame_words.py's
// folded_shims): a walk that left it out here would give the verifier a path for each count of
// shims. Cut at PYTHON_FRAMES words (counted).
static __always_inline void python_walk(struct pending_call *call)
{
    struct walk_state *w = &call->walk;
    struct python_proc *python = python_procs.lookup(&w->tgid);
    if (!python || python->gen != call->gen)
        return;
    struct python_offsets *row = &python->offsets;
    u32 code_at = row->frame_code, previous_at = row->frame_previous, last_at = row->frame_instruction;
    u32 entry_at = row->frame_entry, shim = row->shim_owner, instructions = row->code_instructions;
    if (code_at > PYTHON_FRAME_HEAD - 8 || previous_at > PYTHON_FRAME_HEAD - 8 || last_at > PYTHON_FRAME_HEAD - 8 ||
        entry_at > PYTHON_FRAME_HEAD - 1)
        return;  // user space checks each row (versions.py's sound): never so
    u64 frame = python_current_frame(python);
    u64 base = 0;  // the window's start (its size: 0, none yet)
    u32 size = 0, at = w->depth;
#pragma clang loop unroll(disable)
    for (u32 i = 0; i < PYTHON_FRAMES && frame; i++) {
        u64 into = (u64)at + i;
        asm volatile("" : "+r"(into));  // an index checked here, not a pointer carried from the last frame
        if (into >= STACK_WORDS)
            return;
        u64 offset = frame - base;
        if (frame < base || size < PYTHON_FRAME_HEAD || offset > size - PYTHON_FRAME_HEAD) {
            size = python_window(call, frame);
            base = frame + PYTHON_FRAME_HEAD - size;
            offset = size - PYTHON_FRAME_HEAD;
        }
        asm volatile("" : "+r"(offset));  // checked here, as the index used
        if (size < PYTHON_FRAME_HEAD || offset > STACK_COPY - PYTHON_FRAME_HEAD)
            return;
        u8 *head = &call->stack_copy[offset];
        // Masked at their use, which changes none (each was checked above), for verifiers
        // (Linux 5.10) that keep no bound on a copy spilled before that check; the record's
        // slack after stack_copy holds what the mask allows past a frame's head.
        asm volatile("" : "+r"(code_at), "+r"(previous_at), "+r"(last_at), "+r"(entry_at));
        code_at &= PYTHON_FIELD_MASK, previous_at &= PYTHON_FIELD_MASK;
        last_at &= PYTHON_FIELD_MASK, entry_at &= PYTHON_FIELD_MASK;
        u8 entry = head[entry_at];
        u64 code = *(u64 *)(head + code_at), last = *(u64 *)(head + last_at);
        u64 word = python_frame_word(code, last, instructions, !shim && entry);
        call->stack.walk.ip[into] = shim && entry == shim ? PYTHON_SHIM_WORD : word;
        frame = *(u64 *)(head + previous_at);
    }
    if (frame)
        count(C_PYTHON_CUT);
}
