// The preload library's table left without memory: the address space is capped
// (RLIMIT_AS) 12 MiB above what the process has, and blocks of 56 bytes are made
// until argv[1] of them exist or malloc fails; the table, which doubles as it fills,
// runs out of room before the blocks do. The cap is then lifted (the library's exit
// dump needs memory) and "made N" printed: the blocks malloc gave, all kept.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static long vm_size_kib(void)
{
    char text[4096];
    FILE *status = fopen("/proc/self/status", "r");
    size_t n = fread(text, 1, sizeof text - 1, status);
    fclose(status);
    text[n] = 0;
    const char *line = strstr(text, "VmSize:");
    return line ? atol(line + 7) : -1;
}

int main(int argc, char **argv)
{
    long wanted = argc > 1 ? atol(argv[1]) : 400000, made = 0;
    struct rlimit old, capped;
    getrlimit(RLIMIT_AS, &old);
    capped = old;
    capped.rlim_cur = (rlim_t)(vm_size_kib() + 12 * 1024) * 1024;
    setrlimit(RLIMIT_AS, &capped);
    while (made < wanted && malloc(56))
        made++;
    setrlimit(RLIMIT_AS, &old);
    char line[64];
    int length = snprintf(line, sizeof line, "made %ld\n", made);
    write(1, line, (size_t)length);
    return 0;
}
