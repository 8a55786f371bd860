// A family of processes whose live blocks are known per process, for fork following.
//
// parent P: keep[3] x 111, for_child_free 333, for_child_realloc 444 and
//           for_parent_free 222 before fork; after fork P frees for_parent_free at once.
// child C:  at once frees for_child_free, reallocs for_child_realloc to 555,
//           mallocs 666 and forks G; 100 ms later (copy made) frees keep[2].
// grandchild G: at once frees keep[0] and mallocs 777.
// exec child E (vfork + exec of this program with "exec"): mallocs 888 only.
// With "many": one block of 99, then 8 children at once that keep it and exit.
// With "many_exec": the same, but each child execs this program as "exec" at once.
//
// At exit: P: 3x111, 333, 444.   C: 111 x2, 222 inherited; 555, 666 own.
// G: 111 x2, 222, 555, 666 inherited; 777 own.   E: 888 own.
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void *volatile sink;

static void grandchild(void **keep)
{
    free(keep[0]);
    sink = malloc(777);
    usleep(300000);
    _exit(0);
}

static void child(void **keep, void *for_child_free, void *for_child_realloc)
{
    free(for_child_free);
    sink = realloc(for_child_realloc, 555);
    sink = malloc(666);
    pid_t g = fork();
    if (g == 0)
        grandchild(keep);
    usleep(100000);
    free(keep[2]);
    waitpid(g, NULL, 0);
    _exit(0);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "exec") == 0) {
        sink = malloc(888);
        return 0;
    }
    if (argc > 1 && (strcmp(argv[1], "many") == 0 || strcmp(argv[1], "many_exec") == 0)) {
        sink = malloc(99);
        for (int i = 0; i < 8; i++)
            if (fork() == 0) {
                if (strcmp(argv[1], "many_exec") == 0)
                    execl(argv[0], argv[0], "exec", (char *)NULL);
                usleep(200000);
                _exit(0);
            }
        while (wait(NULL) > 0)
            ;
        return 0;
    }
    void *keep[3];
    for (int i = 0; i < 3; i++)
        keep[i] = malloc(111);
    void *for_child_free = malloc(333);
    void *for_child_realloc = malloc(444);
    void *for_parent_free = malloc(222);
    pid_t c = fork();
    if (c == 0)
        child(keep, for_child_free, for_child_realloc);
    free(for_parent_free);
    waitpid(c, NULL, 0);

    pid_t e = vfork();
    if (e == 0) {
        execl("/proc/self/exe", argv[0], "exec", (char *)NULL);
        _exit(127);
    }
    waitpid(e, NULL, 0);
    usleep(100000);
    sink = keep;
    return 0;
}
