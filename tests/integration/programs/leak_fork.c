// valgrind's leak kinds across a fork, each process judged at its own exit:
//   before the fork, the parent: lost_before_fork 40 definitely lost, kept_before_fork 56
//       still reachable (a global); the child inherits both
//   the child: a thread of its own makes child_blocks, 2 x 24 definitely lost and 1 x 72
//       possibly lost (only a pointer 8 bytes in is kept); then the child exits
//   the parent, once the child is gone: lost_after_fork 88 definitely lost
// At the child's exit: 40 + 48 definite, 72 possible, 56 reachable. At the parent's: 40 + 88
// definite, 56 reachable. The stack below each call is scrubbed, as in leak_kinds.c.
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "leak_blocks.h"

void *volatile kept_start;
char *volatile kept_interior;

__attribute__((noinline)) static void lost_before_fork(void) { make(40); }

__attribute__((noinline)) static void kept_before_fork(void) { kept_start = make(56); }

__attribute__((noinline)) static void lost_after_fork(void) { make(88); }

__attribute__((noinline)) static void child_blocks(void)
{
    make(24);
    make(24);
    kept_interior = (char *)make(72) + 8;
}

static void *child_thread(void *unused)
{
    child_blocks();
    scrub();
    return unused;
}

int main(void)
{
    lost_before_fork();
    kept_before_fork();
    scrub();
    pid_t child = fork();
    if (child < 0)
        return 1;
    if (child == 0) {
        pthread_t thread;
        if (pthread_create(&thread, NULL, child_thread, NULL) != 0 || pthread_join(thread, NULL) != 0)
            _exit(1);
        scrub();
        exit(0);
    }
    int status;
    if (waitpid(child, &status, 0) != child || status != 0)
        return 1;
    lost_after_fork();
    scrub();
    return 0;
}
