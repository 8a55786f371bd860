/* Stacks built without frame pointers (-O2 -fomit-frame-pointer), one site per size:
 * depths 2, 4, 8, 12 and 24 below main (1000 + depth bytes), a thread (3000), a function
 * of a library linked at start (4000), one of a library dlopen'ed later (argv[1]: 2345,
 * and 1234 from its constructor), and a signal handler (5000). */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

void *volatile kept[16];
void linked_alloc(void);

__attribute__((noinline)) void descend(int depth, int size)
{
    if (depth <= 1)
        kept[depth] = malloc(size);
    else
        descend(depth - 1, size);
    __asm__ volatile("" ::: "memory");   /* no tail call: every level keeps its frame */
}

__attribute__((noinline)) static void *thread_body(void *arg)
{
    kept[8] = malloc(3000);
    __asm__ volatile("" ::: "memory");
    return arg;
}

__attribute__((noinline)) static void on_signal(int sig)
{
    kept[9] = malloc(5000 + sig - SIGUSR1);
    __asm__ volatile("" ::: "memory");
}

int main(int argc, char **argv)
{
    static const int depths[] = {2, 4, 8, 12, 24};
    for (int i = 0; i < 5; i++)
        descend(depths[i], 1000 + depths[i]);
    pthread_t thread;
    pthread_create(&thread, NULL, thread_body, NULL);
    pthread_join(thread, NULL);
    linked_alloc();
    signal(SIGUSR1, on_signal);
    raise(SIGUSR1);
    void *plugin = argc > 1 ? dlopen(argv[1], RTLD_NOW) : NULL;
    if (!plugin) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    ((void (*)(void))dlsym(plugin, "plugin_leak"))();
    return 0;
}
