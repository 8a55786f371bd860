// Loads DIR/m0.so .. DIR/m{N-1}.so one after another, calling each one's touch() (one malloc);
// with a third argument, then says "ready" and waits to be attached to.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 4)
        return 2;
    char path[4096];
    for (int i = 0; i < atoi(argv[2]); i++) {
        snprintf(path, sizeof path, "%s/m%d.so", argv[1], i);
        void *module = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!module)
            return 1;
        ((void (*)(void))dlsym(module, "touch"))();
    }
    if (argc == 4) {
        puts("ready");
        fflush(stdout);
        for (;;)
            pause();
    }
    return 0;
}
