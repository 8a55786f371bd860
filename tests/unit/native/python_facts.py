"""Run by an interpreter under test (tests/unit/test_python_versions.py) with its module's path
and where leaktrace says its thread-state key is (from the module's mapping at file offset 0):
prints as JSON what it says of itself, for the test to hold leaktrace's row and key against:
where a code object keeps its fields, where compact strs keep their characters, what the key
gives this thread, and each instruction's line in some modules of its own."""

import ctypes
import json
import sys
import types


def offset_of(obj, value, size, width=8):
    """Where in obj's first size bytes value sits (words of width bytes)."""
    kind = ctypes.c_uint64 if width == 8 else ctypes.c_int32
    words = (kind * (size // width)).from_address(id(obj))
    return [i * width for i, word in enumerate(words) if word == value]


def sample():
    return 1


code = sample.__code__
size = type(code).__basicsize__
ascii_text, wide_text = "sample_ascii", "sample_\u00e9\u00e9"
libc = ctypes.CDLL(None)
libc.pthread_getspecific.restype = ctypes.c_void_p
ctypes.pythonapi.PyGILState_GetThisThreadState.restype = ctypes.c_void_p


def key_facts(module, relative):
    """(whether the key is made, whether it gives this thread's state)."""
    with open("/proc/self/maps") as maps:
        [start] = [
            int(line.split("-")[0], 16) for line in maps if line.split()[-1] == module and line.split()[2] == "00000000"
        ]
    made, key = (
        ctypes.c_int.from_address(start + relative - 4).value,
        ctypes.c_uint.from_address(start + relative).value,
    )
    return [made, libc.pthread_getspecific(key) == ctypes.pythonapi.PyGILState_GetThisThreadState()]


def positions(module):
    found = []
    with open(module.__file__) as source:
        top = compile(source.read(), module.__file__, "exec")
    pending = [top]
    while pending:
        each = pending.pop()
        pending += [c for c in each.co_consts if isinstance(c, types.CodeType)]
        lines = [line for line, *_ in each.co_positions()]
        found.append([each.co_linetable.hex(), each.co_firstlineno, lines])
    return found


import email.message  # noqa: E402
import json.decoder  # noqa: E402

print(
    json.dumps(
        {
            "version": list(sys.version_info[:2]),
            "code_instructions": size,
            "code_filename": offset_of(code, id(code.co_filename), size),
            "code_qualname": offset_of(code, id(code.co_qualname), size),
            "code_linetable": offset_of(code, id(code.co_linetable), size),
            "code_first_line": offset_of(code, code.co_firstlineno, size, 4),
            "str_ascii_data": ctypes.string_at(id(ascii_text), 80).find(ascii_text.encode()),
            "str_compact_data": ctypes.string_at(id(wide_text), 96).find(wide_text.encode("latin-1")),
            "key": key_facts(sys.argv[1], int(sys.argv[2], 16)),
            "positions": positions(email.message) + positions(json.decoder),
        }
    )
)
