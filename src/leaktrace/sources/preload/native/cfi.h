// Call frame information read in the process itself: the rule that finds a caller's frame
// from a pc, in the BPF walk's own terms (struct unwind_row, CFA_* and RBP_* of
// sources/bpf/layout.h), so that both engines follow a frame the same way.
#pragma once
#include <stdint.h>

typedef uint8_t u8;
typedef int16_t s16;
typedef uint16_t u16;
typedef uint32_t u32;
typedef int32_t s32;
typedef uint64_t u64;
#include "layout.h"  // sources/bpf/layout.h: one definition of a row for the kernel and for us

int cfi_usable(void);  // 0 where the C library cannot find a pc's module for us (_dl_find_object)

// The rule in force at pc, worked out from the .eh_frame of the module that holds it (found
// with _dl_find_object). 0 when no FDE covers pc. Async-signal-safe; never allocates.
int cfi_rule_at(uintptr_t pc, struct unwind_row *rule);
