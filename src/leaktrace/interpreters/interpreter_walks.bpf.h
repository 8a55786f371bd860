// The interpreters' BPF walks, after a stack's native frames: leaktrace.bpf.c calls only
// interpreter_walks. Each walk's header brings its own maps; included where call, read_user
// and count are.
#if PYTHON_FRAMES
#include "python_walk.bpf.h"  // CPython's (interpreters/python/)
#endif

static __always_inline void interpreter_walks(struct pending_call *call)
{
#if PYTHON_FRAMES
    python_walk(call);
#endif
}
