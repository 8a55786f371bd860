// Python frames in a stack: one word a frame, after the native frames, innermost first. The
// top bits are a tag no user address has; then whether the frame is its eval loop's entry
// frame, the index of its last instruction, and its code object's address. Both engines write
// them (the preload library and leaktrace.bpf.c); layout_gen.py writes python_layout.py from here.
// Kept to what layout_gen.py reads: #define NAME NUMBER and structs of u32/u64.
#ifndef LEAKTRACE_PYTHON_FRAMES_H
#define LEAKTRACE_PYTHON_FRAMES_H

#define PYTHON_FRAME_TAG 0xc000000000000000
#define PYTHON_FRAME_ENTRY 0x2000000000000000
#define PYTHON_FRAME_INDEX_SHIFT 44
#define PYTHON_FRAME_INDEX_MASK 0x1ffff  // an index past it, or before the first instruction, is this
#define PYTHON_FRAME_CODE_SHIFT 3        // code objects are 8-aligned: their address >> 3 fits 44 bits
#define PYTHON_FRAME_CODE_MASK 0xfffffffffff
#define PYTHON_MAX_FRAMES 32  // a stack's Python frames past these are cut (counted)

// CPython 3.11 on x86-64: where a thread's frames and a frame's code are (Include/internal/
// pycore_frame.h, cpython/code.h), checked against the interpreter before use.
#define PY311_VERSION 0x030b
#define PY311_TSTATE_CFRAME 0x38
#define PY311_CFRAME_CURRENT_FRAME 0x8
#define PY311_FRAME_CODE 0x20
#define PY311_FRAME_PREVIOUS 0x30
#define PY311_FRAME_PREV_INSTR 0x38
#define PY311_FRAME_IS_ENTRY 0x44
#define PY311_CODE_FIRSTLINENO 0x48
#define PY311_CODE_FILENAME 0x70
#define PY311_CODE_QUALNAME 0x80
#define PY311_CODE_LINETABLE 0x88
#define PY311_CODE_FIRSTTRACEABLE 0xa8
#define PY311_CODE_ADAPTIVE 0xb8  // the instructions: PyCode_Type's tp_basicsize, 2 bytes each
#define PY311_CODE_UNIT 2
// A type object, a str (PEP 393's compact forms) and a bytes object, as the code readers copy them.
#define PY311_TYPE_NAME 24       // PyTypeObject's tp_name, after the object's head
#define PY311_TYPE_BASICSIZE 32  // then tp_basicsize and tp_itemsize
#define PY311_STR_LENGTH 16
#define PY311_STR_STATE 32         // bits 2-4: bytes a character; 5: compact; 6: ASCII
#define PY311_STR_ASCII_DATA 48    // a compact ASCII string's characters
#define PY311_STR_COMPACT_DATA 72  // any other compact string's
#define PY311_BYTES_SIZE 16
#define PY311_BYTES_DATA 32
#define PYTHON_NAME_MOST 1024  // characters of a name or a file name kept
// glibc 2.36's pthread_getspecific for a key below 32: the thread's own block of key data.
#define GLIBC_SPECIFIC_FIRST 0x310
#define GLIBC_SPECIFIC_SLOT 16
#define GLIBC_SPECIFIC_DATA 8
#define GLIBC_SPECIFIC_FIRST_KEYS 32

// A traced process that runs CPython 3.11 (the BPF engine's python_procs map, by tgid): the
// address of its image's thread-state key (_PyRuntime.gilstate.autoTSSkey: an int that says
// it is made, then the key itself).
struct python_proc {
    u64 key_address;
    u32 gen;  // the image it is in
    u32 unused;
};

// The word of a frame whose code object is at code and whose last instruction is at prev_instr.
static inline u64 python_frame_word(u64 code, u64 prev_instr, u32 entry)
{
    u64 first = code + PY311_CODE_ADAPTIVE;
    u64 index = prev_instr >= first ? (prev_instr - first) / PY311_CODE_UNIT : PYTHON_FRAME_INDEX_MASK;
    if (index > PYTHON_FRAME_INDEX_MASK)
        index = PYTHON_FRAME_INDEX_MASK;
    return PYTHON_FRAME_TAG | (entry ? PYTHON_FRAME_ENTRY : 0) | index << PYTHON_FRAME_INDEX_SHIFT |
           ((code >> PYTHON_FRAME_CODE_SHIFT) & PYTHON_FRAME_CODE_MASK);
}

#endif
