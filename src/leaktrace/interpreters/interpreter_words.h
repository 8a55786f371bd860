// What a native stack walk knows of the interpreters' frames (interpreters/table.py's rows,
// whose kernel_cflags turn each walk on): the room they take after a stack's native frames,
// and the slack their walks' masked reads need past a thread's stack copy.
#ifndef LEAKTRACE_INTERPRETER_WORDS_H
#define LEAKTRACE_INTERPRETER_WORDS_H

#include "python_frames.h"

#ifdef PYTHON_FRAMES
#define INTERPRETER_FRAMES PYTHON_FRAMES  // 0: no walk of CPython's frames
#else
#define INTERPRETER_FRAMES 0
#endif
#define INTERPRETER_COPY_SLACK (PYTHON_FIELD_MASK + 8 - PYTHON_FRAME_HEAD)  // python_walk's masks

#endif
