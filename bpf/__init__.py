"""BPF C sources, compiled by bcc at run time; shipped as package data of leaktrace.bpf."""
