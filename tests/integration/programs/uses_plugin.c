// Uses tests/integration/programs/plugin.c: with a path argument it dlopens it (and never
// closes it, so its code stays mapped for symbols); built with -DLINKED it is linked.
// With a second argument "wait" it prints "ready" once the plugin is loaded, then calls
// plugin_leak() once per line read from stdin, printing "done" after each; with "close"
// it unloads the plugin after plugin_leak() (the blocks stay, the code is unmapped).
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

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
    void (*leak)(void) = (void (*)(void))dlsym(plugin, "plugin_leak");
    if (argc > 2 && !strcmp(argv[2], "wait")) {
        char line[64];
        printf("ready\n");
        fflush(stdout);
        while (fgets(line, sizeof(line), stdin)) {
            leak();
            printf("done\n");
            fflush(stdout);
        }
        return 0;
    }
    leak();
    if (argc > 2 && !strcmp(argv[2], "close"))
        dlclose(plugin);
#endif
    return 0;
}
