"""The in-process engine: the LD_PRELOAD library (native/) and its table read from outside."""
