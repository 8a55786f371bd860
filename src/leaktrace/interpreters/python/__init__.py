"""CPython: the version table (versions.py; 3.13 on from the interpreter's _Py_DebugOffsets),
the words both engines write for its frames (python_frames.h, frame_words.py), where a module keeps its
thread-state key (interpreter.py), the code objects' readers (code_objects.py), and the two walks:
python_stack.c in the preload library, python_walk.bpf.h in the BPF program."""
