// The state of the BPF stack walk (walk.bpf.h), kept in each thread's pending call and handed
// from program to program by tail calls; plain C, so that the walk runs in user space too
// (tests/unit/native/walk_replay.c). Needs rows.h, and STACK_DEPTH and MAX_EXEC_MAPS defined.
#ifndef LEAKTRACE_WALK_STATE_H
#define LEAKTRACE_WALK_STATE_H

#ifndef INTERPRETER_FRAMES
#define INTERPRETER_FRAMES 0  // room for a stack's interpreter frames (interpreter_words.h), after its native ones
#endif
#define STACK_WORDS (STACK_DEPTH + INTERPRETER_FRAMES)

struct stack_val {
    u64 ip[STACK_WORDS];
};

// A process's executable mappings, sorted by start: each with the rows of its file and their
// page index: for each 2^page_shift bytes of the module from page_origin on, the rows
// that can hold the rule of an address there (from the one in effect where the page starts
// to the one where the next starts), so that a row search covers one page's rows.
struct exec_maps {
    u32 gen;  // the image they describe
    u32 count;
    struct exec_map map[MAX_EXEC_MAPS];
};

// The walk of the call returning now, handed from program to program by tail calls.
struct walk_state {
    u64 pc;  // a return address (the next frame to record)
    u64 sp;
    u64 bp;
    u32 depth;  // frames recorded
    u32 end;    // WALK_*
    u32 tgid;
    u32 copied;    // bytes of the stack copied from copy_base on (0: every read goes to user memory)
    u32 last_map;  // the mapping of the last frame: the next one is most often in it too
    u32 why;       // WALK_TRUNCATED: the counter of its reason (C_TRUNCATED_*)
    u32 fp_ended;  // pc came from a frame-pointer chain's last link: kept only if its rows need no rbp
    u64 copy_base;
};
// The stack is read a window at a time (a user read costs 0.1-0.2 us here, nearly the same
// for 16 bytes as for 2 KiB): STACK_COPY bytes above the call, then from wherever the walk
// next reads above the window; near the stack's end, to the end of the page, else word by word.
#define STACK_COPY 2048
#define WALK_ON 0
#define WALK_COMPLETE 1   // the outermost frame, or the frame limit
#define WALK_TRUNCATED 2  // a frame that could not be followed or trusted
#define FRAMES_PER_PROGRAM 8

#endif
