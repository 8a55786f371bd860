/* Attaches the in-process library (argv[1]) to itself as leaktrace -p has a process do it:
   dlopen, then leaktrace_attach, which points the program's GOT slots of malloc at the
   library. Then sites.c runs (50 blocks of 16 bytes leak from four call sites: 10, 10, 10
   and 20), and the library's leak_track logs them at exit. Exit 2: the attach was refused. */
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define main leak_from_four_sites
#include "sites.c"
#undef main

int main(int argc, char **argv)
{
    void *library = argc > 1 ? dlopen(argv[1], RTLD_NOW | RTLD_LOCAL) : NULL;
    int (*attach)(const char *, int, size_t, uint64_t) =
        library ? (int (*)(const char *, int, size_t, uint64_t))dlsym(library, "leaktrace_attach") : NULL;
    int refused = attach ? attach("backtrace leak_track", -1, 0, 0) : -1;
    if (refused) {
        fprintf(stderr, "self_attach: attach refused (%d): %s\n", refused, library ? "" : dlerror());
        return 2;
    }
    return leak_from_four_sites();
}
