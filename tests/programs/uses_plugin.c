// Uses tests/programs/plugin.c: with a path argument it dlopens it (and never
// closes it, so its code stays mapped for symbols); built with -DLINKED it is linked.
#include <dlfcn.h>
#include <stdio.h>

#ifdef LINKED
void plugin_leak(void);
#endif

int main(int argc, char **argv)
{
#ifdef LINKED
    (void)argc;
    (void)argv;
    plugin_leak();
#else
    void *plugin = argc > 1 ? dlopen(argv[1], RTLD_NOW) : NULL;
    if (!plugin) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    ((void (*)(void))dlsym(plugin, "plugin_leak"))();
#endif
    return 0;
}
