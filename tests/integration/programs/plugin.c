// A shared library that allocates in its constructor (at load: by ld.so, before
// main when linked, inside dlopen when loaded later) and in plugin_leak().
#include <stdlib.h>

void *volatile plugin_kept[2];

__attribute__((constructor)) void plugin_init(void)
{
    plugin_kept[0] = malloc(1234);
}

void plugin_leak(void)
{
    plugin_kept[1] = malloc(2345);
}
