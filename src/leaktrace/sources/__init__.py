"""Where snapshots come from: the BPF engine, the LD_PRELOAD library, the glibc heap walk."""
