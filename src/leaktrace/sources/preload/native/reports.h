// What the library writes: the v1.2 heap dump, the counters, sites and interpreters' code
// tables beside it, and the leak_track log (reports.c).
#pragma once
#include "library.h"

void write_dump(const char *suffix);
void write_counters(const char *suffix);  // PREFIX.PID<suffix>: the counters as one line, in enum order
void write_sites(const char *suffix);     // PREFIX.PID<suffix>: the peak and the sites, as kept (record.h)
void write_interpreter_codes(void);       // PREFIX.PID<its suffix>: each interpreter's code table, as kept
void log_leaks(void);
