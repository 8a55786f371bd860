/* deny_syscall NR[:ARG0] ERRNO CMD ARGS...: runs CMD with syscall NR (only
 * when its first argument is ARG0, if given) failing with ERRNO (a seccomp
 * filter), to show how leaktrace behaves without bpf() or without one of its
 * commands. */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: deny_syscall NR[:ARG0] ERRNO CMD ARGS...\n");
        return 2;
    }
    char *colon = strchr(argv[1], ':');
    unsigned nr = atoi(argv[1]), err = atoi(argv[2]);
    /* Without ARG0 the argument test compares the number with itself. */
    unsigned arg0 = colon ? (unsigned)atoi(colon + 1) : nr;
    unsigned arg0_offset = colon ? offsetof(struct seccomp_data, args[0]) : offsetof(struct seccomp_data, nr);
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, arg0_offset),   /* low half on x86_64 */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arg0, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (err & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof code / sizeof code[0], .filter = code};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
        perror("seccomp");
        return 2;
    }
    execvp(argv[3], argv + 3);
    perror("execvp");
    return 127;
}
