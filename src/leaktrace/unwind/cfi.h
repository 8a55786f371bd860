// Call frame information, in the BPF walk's own terms (struct unwind_row, CFA_* and RBP_* of
// rows.h), so that both engines follow a frame the same way: the rule at a pc of this
// process (the preload library's walk), and every row of a module file (unwind/tables.py).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "user_types.h"  // the type names rows.h is written in
#include "rows.h"        // one definition of a row for the kernel and for us

#ifndef CFI_EXPORT
#define CFI_EXPORT  // built into the _cfi module for unwind/tables.py, where it is exported
#endif

int cfi_usable(void);  // 0 where the C library cannot find a pc's module for us (_dl_find_object)

// The rule in force at pc, worked out from the .eh_frame of the module that holds it (found
// with _dl_find_object). 0 when no FDE covers pc. Async-signal-safe; never allocates.
int cfi_rule_at(uintptr_t pc, struct unwind_row *rule);

// Every row of an .eh_frame section (size bytes at section, loaded at address), FDE after FDE
// in section order, each FDE's rows from its start, into out; -1 when there are more than max.
CFI_EXPORT long cfi_section_rows(const uint8_t *section, size_t size, uint64_t address, struct cfi_section_row *out,
                                 size_t max);
