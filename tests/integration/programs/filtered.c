// filtered ACTION NR [FLAGS]: keeps 3 blocks of 1,111 bytes, then installs a seccomp filter
// that answers ACTION for system call NR (when FLAGS is given, only when its fourth argument,
// mmap's flags, has those bits) and allows the rest, prints "ready" and reads lines on stdin:
// "alloc" keeps 5 blocks of 2,222 bytes (no new mapping: the heap has room) and says "done".
// ACTION: errno:N, kill, trap, log, trace or notif (a listener no one answers). "filtered only
// NR,NR,...": those calls allowed, every other one kills the process.
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

void *volatile kept[8];

#ifdef __aarch64__
#define AUDIT_ARCH_HERE AUDIT_ARCH_AARCH64
#else
#define AUDIT_ARCH_HERE AUDIT_ARCH_X86_64
#endif

static unsigned action_of(const char *name)
{
    if (!strncmp(name, "errno:", 6))
        return SECCOMP_RET_ERRNO | (unsigned)atoi(name + 6);
    if (!strcmp(name, "kill"))
        return SECCOMP_RET_KILL_PROCESS;
    if (!strcmp(name, "trap"))
        return SECCOMP_RET_TRAP;
    if (!strcmp(name, "log"))
        return SECCOMP_RET_LOG;
    if (!strcmp(name, "trace"))
        return SECCOMP_RET_TRACE;
    return SECCOMP_RET_USER_NOTIF;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    unsigned nr = (unsigned)atoi(argv[2]), flags = argc > 3 ? (unsigned)strtoul(argv[3], NULL, 0) : 0;
    for (int i = 0; i < 3; i++)
        kept[i] = malloc(1111);
    void *volatile room = malloc(64 << 10);  // the heap grows now: later blocks need no mapping
    free(room);
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_HERE, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[3])),
        flags ? (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, flags, 0, 1)
              : (struct sock_filter)BPF_STMT(BPF_JMP | BPF_JA, 0),
        BPF_STMT(BPF_RET | BPF_K, action_of(argv[1])),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_filter allowed[256] = {BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr))};
    unsigned short length = 1;
    for (char *next = argv[2]; !strcmp(argv[1], "only") && *next && length < 254; next += *next == ',') {
        allowed[length++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, strtoul(next, &next, 10), 0, 1);
        allowed[length++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    }
    allowed[length++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
    struct sock_fprog program = {sizeof code / sizeof code[0], code};
    if (!strcmp(argv[1], "only"))
        program = (struct sock_fprog){length, allowed};
    unsigned mode_flags = action_of(argv[1]) == SECCOMP_RET_USER_NOTIF ? SECCOMP_FILTER_FLAG_NEW_LISTENER : 0;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, mode_flags, &program) < 0) {
        perror("seccomp");
        return 1;
    }
    puts("ready");
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strcmp(line, "alloc\n") == 0) {
            for (int i = 3; i < 8; i++)
                kept[i] = malloc(2222);
            puts("done");
            fflush(stdout);
        }
    }
    return 0;
}
