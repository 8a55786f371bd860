// backtrace_enable_on_signal: blocks of 111, 222 and 333 bytes with the program
// toggling stacks (SIGRTMAX-19) between them; prints get_malloc_leak_info's entries.
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef void leak_info_function(uint8_t **, size_t *, size_t *, size_t *, size_t *);

static void *volatile kept[3];

int main(void)
{
    kept[0] = malloc(111);
    raise(SIGRTMAX - 19);
    kept[1] = malloc(222);
    raise(SIGRTMAX - 19);
    kept[2] = malloc(333);
    leak_info_function *get = (leak_info_function *)dlsym(RTLD_DEFAULT, "get_malloc_leak_info");
    void (*release)(uint8_t *) = (void (*)(uint8_t *))dlsym(RTLD_DEFAULT, "free_malloc_leak_info");
    uint8_t *info;
    size_t overall, info_size, total, depth;
    get(&info, &overall, &info_size, &total, &depth);
    for (size_t at = 0; at < overall; at += info_size) {
        const size_t *entry = (const size_t *)(info + at);
        printf("entry %zu %zu %s\n", entry[0], entry[1], entry[2] ? "stack" : "none");
    }
    printf("total %zu depth %zu\n", total, depth);
    release(info);
    return 0;
}
