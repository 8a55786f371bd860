# Generated from interpreters/python/python_frames.h by abi/layout_gen.py; tests/unit/test_layouts.py checks it.
import struct

PYTHON_FRAME_TAG = 0xc000000000000000
PYTHON_FRAME_ENTRY = 0x2000000000000000
PYTHON_FRAME_INDEX_SHIFT = 44
PYTHON_FRAME_INDEX_MASK = 0x1ffff
PYTHON_FRAME_CODE_SHIFT = 3
PYTHON_FRAME_CODE_MASK = 0xfffffffffff
PYTHON_MAX_FRAMES = 32
PYTHON_SHIM_WORD = 0xe000000000000000
PYTHON_NO_CFRAME = 0xffffffff
PYTHON_CODE_UNIT = 2
PYTHON_FRAME_HEAD = 72
PYTHON_FIELD_MASK = 127
PYTHON_TYPE_NAME = 24
PYTHON_TYPE_BASICSIZE = 32
PYTHON_STR_LENGTH = 16
PYTHON_STR_STATE = 32
PYTHON_BYTES_SIZE = 16
PYTHON_BYTES_DATA = 32
PYTHON_NAME_MOST = 1024
GLIBC_SPECIFIC_FIRST = 0x310
GLIBC_SPECIFIC_SLOT = 16
GLIBC_SPECIFIC_DATA = 8
GLIBC_SPECIFIC_FIRST_KEYS = 32

PYTHON_OFFSETS = struct.Struct('<IIIIIIIIIIIIIIII')   # version, tstate_frame, cframe_frame, frame_code, frame_previous, frame_instruction, frame_entry, shim_owner, code_first_line, code_filename, code_qualname, code_linetable, code_instructions, str_ascii_data, str_compact_data, unused

PYTHON_PROC = struct.Struct('<QIIIIIIIIIIIIIIIIII')   # key_address, gen, unused, offsets
