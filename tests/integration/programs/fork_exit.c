// For the preload library's fork handling; both processes exit normally (exit dumps):
// parent: 2 x 100 before the fork, both kept.
// child:  inherits both, frees one, allocates 1 x 200.
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void *volatile keep[3];

int main(void)
{
    keep[0] = malloc(100);
    keep[1] = malloc(100);
    pid_t child = fork();
    if (child == 0) {
        free(keep[1]);
        keep[2] = malloc(200);
        exit(0);
    }
    waitpid(child, NULL, 0);
    return 0;
}
