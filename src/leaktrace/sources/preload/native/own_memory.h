// Memory of the library's own (own_memory.c), which leaktrace reads to tell the library's
// addresses from the program's.
#pragma once
#include "library.h"
#include "record.h"  // struct own_map, OWN_MAPS: the list leaktrace reads

// Memory of the library's own that holds the program's addresses: mapped and listed in
// leaktrace_own_maps (MAP_FAILED if no mapping; unlisted when the list is full, and counted).
void *map_own(size_t bytes);
void unmap_own(void *start, size_t bytes);
// A block of the library's from the program's heap, cleared as it goes back: the program may be
// handed it next, and no address the library kept may then seem to be the program's.
void free_own(void *block, size_t bytes);
