"""Android's formats and options, byte for byte: malloc_debug options, leak info, heap dump, logs."""
