/* Leaks of known shapes, made before any tracer looks: a list, a tree, a cycle, blocks
 * only an interior pointer holds, freed blocks left in tcache and fastbins, mmapped
 * chunks, and blocks of two threads' own arenas. Then "ready\n" in the file argv[2]
 * names and a wait for SIGTERM (argv[1] "wait"; each SIGUSR1 leaks a list of 3 more), or
 * an exit for valgrind's leak check (argv[1] "exit"); argv[3] "corrupt" overwrites the
 * size in a live chunk's header first. */
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct node { struct node *left, *right; char payload[40]; };   /* 56 bytes */

void *kept[64];          /* reachable blocks */
char *interior;          /* points 100 bytes into a block: upstream counts it reachable */
int kept_count;
void *volatile escape;   /* stored then cleared: the compiler may not drop a leak's malloc */

__attribute__((noinline)) static void *leak(void *block) {
    escape = block;
    escape = NULL;
    return block;
}

__attribute__((noinline)) static void keep(void *block) { kept[kept_count++] = block; }

__attribute__((noinline)) static void leak_list(int length) {
    struct node *head = NULL;
    for (int i = 0; i < length; i++) {
        struct node *n = calloc(1, sizeof *n);
        n->left = head;
        head = n;
    }
    leak(head);
}

__attribute__((noinline)) static struct node *tree(int depth) {
    if (!depth)
        return NULL;
    struct node *n = calloc(1, sizeof *n);
    n->left = tree(depth - 1);
    n->right = tree(depth - 1);
    return n;
}

__attribute__((noinline)) static void leak_cycle(void) {
    void **a = calloc(1, 72), **b = calloc(1, 72);
    a[0] = b;
    b[0] = a;
    leak(a);
    leak(b);
}

__attribute__((noinline)) static void fill_free_lists(void) {
    void *small[20], *medium[10];
    for (int i = 0; i < 20; i++)
        small[i] = malloc(24);
    for (int i = 0; i < 10; i++)
        medium[i] = malloc(300);
    for (int i = 0; i < 20; i += 2)   /* 7 to the tcache, 3 to a fastbin */
        free(small[i]);
    for (int i = 0; i < 10; i++) {
        if (i % 3)
            free(medium[i]);
        else
            keep(medium[i]);
    }
    for (int i = 1; i < 20; i += 2) {
        if (i % 4 == 1)
            keep(small[i]);
        else
            leak(memset(small[i], 0, 24));   /* nothing keeps them */
    }
}

static pthread_barrier_t both_done;   /* both threads live at once: each has an arena of its own */

__attribute__((noinline)) static void scrub_stack(void) {
    volatile char room[16384];
    memset((char *)room, 0, sizeof room);
}

__attribute__((noinline)) static void thread_blocks(void) {
    for (int i = 0; i < 8; i++) {
        void *block = malloc(104);
        if (i % 3 == 0)
            keep(block);
        else
            leak(block);
    }
    void *freed[4];
    for (int i = 0; i < 4; i++)
        freed[i] = malloc(136);
    for (int i = 0; i < 4; i++)
        free(freed[i]);
}

/* No pointer to a block stays in the thread's stack, which glibc keeps cached after it exits. */
__attribute__((noinline)) static void *thread_work(void *unused) {
    (void)unused;
    thread_blocks();
    scrub_stack();
    pthread_barrier_wait(&both_done);
    return NULL;
}

int main(int argc, char **argv) {
    int wait = argc > 1 && !strcmp(argv[1], "wait");
    leak_list(10);
    leak(tree(3));
    leak_cycle();
    char *held = malloc(200);
    interior = held + 100;
    fill_free_lists();
    keep(malloc(3 << 19));                 /* mmapped, 1.5 MiB: kept */
    leak(malloc(1 << 20));                 /* mmapped, 1 MiB: leaked */
    pthread_t threads[2];
    pthread_barrier_init(&both_done, NULL, 2);
    for (int t = 0; t < 2; t++)
        pthread_create(&threads[t], NULL, thread_work, NULL);
    for (int t = 0; t < 2; t++)
        pthread_join(threads[t], NULL);
    malloc_trim(0);
    if (argc > 3 && !strcmp(argv[3], "corrupt"))
        ((size_t *)kept[0])[-1] = 0x7fff0;   /* the size field of a live chunk */
    scrub_stack();
    printf("shapes made\n");   /* stdout's buffer: a block of libc's, reachable */
    fflush(stdout);
    if (argc > 2) {
        FILE *ready = fopen(argv[2], "w");
        fputs("ready\n", ready);
        fclose(ready);
    }
    if (wait) {
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGTERM);
        sigaddset(&set, SIGUSR1);
        sigprocmask(SIG_BLOCK, &set, NULL);
        int signal_number;
        while (!sigwait(&set, &signal_number) && signal_number == SIGUSR1) {
            leak_list(3);
            scrub_stack();
        }
    }
    return 0;
}
