// What another user plants at leaktrace's library path in a target's own view of the file
// system: loading it ends the process at once with status 77, so a test sees that it ran.
#include <unistd.h>

__attribute__((constructor)) static void planted(void)
{
    _exit(77);
}

int leaktrace_attach(const char *options, int watch)
{
    (void)options, (void)watch;
    _exit(78);
}
