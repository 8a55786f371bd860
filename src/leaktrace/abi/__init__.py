"""The layouts C and Python share, in neither engine: the BPF engine's (layout.h) and the
preload library's records (record.h), with the Python written from them (layout_gen.py)."""
