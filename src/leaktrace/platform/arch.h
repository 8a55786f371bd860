// Generated from platform/arch.py (python -m leaktrace.platform.arch); tests/unit/test_layouts.py checks it.
#ifndef LEAKTRACE_ARCH_H
#define LEAKTRACE_ARCH_H

#if defined(__x86_64__) || defined(LEAKTRACE_ARCH_x86_64)
#define ARCH_CALL_SITE_BACK 1
#define ARCH_USER_ADDRESS_BITS 47
#define ARCH_RETURN_POPS_ADDRESS 8
#define ARCH_DWARF_SP 7
#define ARCH_DWARF_FP 6
#define ARCH_DWARF_RA 16
#define ARCH_JUMP_SLOT 7
#define ARCH_GLOB_DAT 6
#define ARCH_ROWS_WALK 1
#define ARCH_MOVES_PROBES 1
#define ARCH_SPIN_HINT() __asm__ volatile("pause")
#elif defined(__aarch64__) || defined(LEAKTRACE_ARCH_aarch64)
#define ARCH_CALL_SITE_BACK 4
#define ARCH_USER_ADDRESS_BITS 48
#define ARCH_RETURN_POPS_ADDRESS 0
#define ARCH_DWARF_SP 31
#define ARCH_DWARF_FP 29
#define ARCH_DWARF_RA 30
#define ARCH_JUMP_SLOT 1026
#define ARCH_GLOB_DAT 1025
#define ARCH_ROWS_WALK 0
#define ARCH_MOVES_PROBES 0
#define ARCH_SPIN_HINT() __asm__ volatile("yield")
#else
#error "no architecture table in platform/arch.py for this machine"
#endif

#endif
