// Holds a uprobe (perf's uprobe PMU, as bcc's attach_uprobe makes them) on PATH at file
// OFFSET with reference counter REF_CTR_OFFSET, in this process only, until killed:
// another tool's probe on the same instruction. Prints "ready" once it is in place.
#include <linux/perf_event.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: refctr_uprobe PATH OFFSET REF_CTR_OFFSET\n");
        return 2;
    }
    FILE *type_file = fopen("/sys/bus/event_source/devices/uprobe/type", "r");
    int type;
    if (!type_file || fscanf(type_file, "%d", &type) != 1) {
        perror("uprobe PMU type");
        return 1;
    }
    struct perf_event_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    attr.type = (uint32_t)type;
    attr.config = strtoull(argv[3], NULL, 0) << 32;
    attr.config1 = (uint64_t)(uintptr_t)argv[1];    // uprobe_path
    attr.config2 = strtoull(argv[2], NULL, 0);       // probe_offset
    long fd = syscall(SYS_perf_event_open, &attr, getpid(), -1, -1, 0);
    if (fd < 0) {
        perror("perf_event_open");
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    pause();
    return 0;
}
