# Generated from unwind/rows.h by abi/layout_gen.py; tests/unit/test_layouts.py checks it.
import struct

CFA_UNKNOWN = 0
CFA_RSP = 1
CFA_RBP = 2
CFA_END = 3
CFA_SIGNAL = 4
RBP_SAME = 0
RBP_SAVED = 1
ROW_PAGE_SHIFT = 9
MAX_FILE_PAGES = 65536
MAX_EXEC_MAPS = 512

UNWIND_ROW = struct.Struct('<IihBB')   # pc, cfa_offset, rbp_offset, cfa_rule, rbp_rule

CFI_SECTION_ROW = struct.Struct('<QQQihBB')   # fde_start, fde_end, pc, cfa_offset, rbp_offset, cfa_rule, rbp_rule

EXEC_MAP = struct.Struct('<QQQIIIIII')   # start, end, bias, first_row, row_count, first_page, page_count, page_origin, page_shift
