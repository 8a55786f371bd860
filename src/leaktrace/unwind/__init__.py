"""The unwinder, one home for both engines: cfi.c interprets .eh_frame (the preload library's
walk, and the compiler of tables.py); rows.h lays out the rows, mappings and page index the
BPF walk reads (rows.py is generated from it); walk.bpf.h is the BPF walk itself, which
tests/unit/native/walk_replay.c also runs in user space on recorded stacks."""
