"""Linux and ELF facts: maps, processes, files a target names, ELF files, bpf() and its checks."""
