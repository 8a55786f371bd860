// Loads DIR/m0.so .. DIR/m{N-1}.so one after another, calling each one's touch() (one malloc).
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    char path[4096];
    for (int i = 0; i < atoi(argv[2]); i++) {
        snprintf(path, sizeof path, "%s/m%d.so", argv[1], i);
        void *module = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!module)
            return 1;
        ((void (*)(void))dlsym(module, "touch"))();
    }
    return 0;
}
