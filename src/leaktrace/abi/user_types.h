// The fixed-width type names layout.h, record.h and rows.h are written in, for user space (a BPF
// program has them from the kernel's headers).
#ifndef LEAKTRACE_USER_TYPES_H
#define LEAKTRACE_USER_TYPES_H
#include <stdint.h>

typedef uint8_t u8;
typedef int16_t s16;
typedef uint16_t u16;
typedef uint32_t u32;
typedef int32_t s32;
typedef uint64_t u64;
typedef int64_t s64;

#endif
