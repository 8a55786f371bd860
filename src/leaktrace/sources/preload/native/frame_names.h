// Names of frames for the library's reports (frame_names.c).
#pragma once
#include "library.h"

struct frame_names;
struct frame_name {
    const char *module;    // the path /proc/self/maps gives; NULL outside every mapping
    uintptr_t rel_pc;      // the pc as an address of the module's file; the pc itself if unknown
    const char *function;  // NULL if unknown
    uintptr_t offset;      // into the function
};
struct frame_names *frame_names_open(void);  // for one report (NULL: names unknown)
void frame_name(struct frame_names *names, uintptr_t pc, struct frame_name *out);
void frame_names_close(struct frame_names *names);
