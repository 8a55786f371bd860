"""The BPF engine: the program (leaktrace.bpf.c), its compile, probes, maps and the BpfTrace API."""
