// Python frames in a stack: one word a frame, after the native frames, innermost first. The
// top bits are a tag no user address has; then whether the frame is its eval loop's entry
// frame, the index of its last instruction, and its code object's address. Both engines write
// them (the preload library and leaktrace.bpf.c); layout_gen.py writes layout.py from here.
// Kept to what layout_gen.py reads: #define NAME NUMBER and structs of u32/u64.
#ifndef LEAKTRACE_PYTHON_FRAMES_H
#define LEAKTRACE_PYTHON_FRAMES_H

#define PYTHON_FRAME_TAG 0xc000000000000000
#define PYTHON_FRAME_ENTRY 0x2000000000000000
#define PYTHON_FRAME_INDEX_SHIFT 44
#define PYTHON_FRAME_INDEX_MASK 0x1ffff  // an index past it, or before the first instruction, is this
#define PYTHON_FRAME_CODE_SHIFT 3        // code objects are 8-aligned: their address >> 3 fits 44 bits
#define PYTHON_FRAME_CODE_MASK 0xfffffffffff
#define PYTHON_MAX_FRAMES 32                 // a stack's Python frames past these are cut (counted)
#define PYTHON_SHIM_WORD 0xe000000000000000  // an eval loop's shim frame (BPF walk): its run began at the frame before

// Where a CPython keeps what the walks read: one row a version (versions.py writes the rows,
// python_versions.h; 3.13 on, read from the interpreter's _Py_DebugOffsets), byte offsets.
struct python_offsets {
    u32 version;            // PY_VERSION_HEX >> 16
    u32 tstate_frame;       // in a thread state: its cframe (3.11, 3.12), else its current frame
    u32 cframe_frame;       // in a cframe: its current frame; PYTHON_NO_CFRAME: no cframe
    u32 frame_code;         // in an interpreter frame: its code object (3.13: f_executable)
    u32 frame_previous;     // the frame it was called from
    u32 frame_instruction;  // its last instruction begun (prev_instr; 3.13: instr_ptr)
    u32 frame_entry;        // a byte: is_entry (3.11) or owner (3.12 on)
    u32 shim_owner;         // 0: that byte says the frame is an entry; else the owner of the eval loop's shim frame
    u32 code_first_line;    // in a code object: co_firstlineno (an int)
    u32 code_filename;
    u32 code_qualname;
    u32 code_linetable;
    u32 code_instructions;  // co_code_adaptive: also PyCode_Type's tp_basicsize
    u32 str_ascii_data;     // a compact ASCII str's characters
    u32 str_compact_data;   // any other compact str's
    u32 unused;
};
#define PYTHON_NO_CFRAME 0xffffffff
#define PYTHON_CODE_UNIT 2     // bytes an instruction (PyCode_Type's tp_itemsize)
#define PYTHON_FRAME_HEAD 72   // a frame's bytes the walks read: every row's frame fields lie in them
#define PYTHON_FIELD_MASK 127  // covers every field's offset in a frame's head (python_walk)
// The same in every version walked: a type object, a str (PEP 393) and a bytes object.
#define PYTHON_TYPE_NAME 24       // PyTypeObject's tp_name, after the object's head
#define PYTHON_TYPE_BASICSIZE 32  // then tp_basicsize and tp_itemsize
#define PYTHON_STR_LENGTH 16
#define PYTHON_STR_STATE 32  // bits 2-4: bytes a character; 5: compact; 6: ASCII
#define PYTHON_BYTES_SIZE 16
#define PYTHON_BYTES_DATA 32
#define PYTHON_NAME_MOST 1024  // characters of a name or a file name kept
// glibc 2.36's pthread_getspecific for a key below 32: the thread's own block of key data.
#define GLIBC_SPECIFIC_FIRST 0x310
#define GLIBC_SPECIFIC_SLOT 16
#define GLIBC_SPECIFIC_DATA 8
#define GLIBC_SPECIFIC_FIRST_KEYS 32

// A traced process that runs a CPython the walk knows (the BPF engine's python_procs map, by
// tgid): the address of its image's thread-state key (autoTSSkey: an int that says it is made,
// then the key itself), and its version's row.
struct python_proc {
    u64 key_address;
    u32 gen;  // the image it is in
    u32 unused;
    struct python_offsets offsets;
};

// The word of a frame whose code object is at code (its instructions from instructions on)
// and whose last instruction begun is at last.
static inline u64 python_frame_word(u64 code, u64 last, u32 instructions, u32 entry)
{
    u64 first = code + instructions;
    u64 index = last >= first ? (last - first) / PYTHON_CODE_UNIT : PYTHON_FRAME_INDEX_MASK;
    if (index > PYTHON_FRAME_INDEX_MASK)
        index = PYTHON_FRAME_INDEX_MASK;
    return PYTHON_FRAME_TAG | (entry ? PYTHON_FRAME_ENTRY : 0) | index << PYTHON_FRAME_INDEX_SHIFT |
           ((code >> PYTHON_FRAME_CODE_SHIFT) & PYTHON_FRAME_CODE_MASK);
}

#endif
