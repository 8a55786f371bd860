// Shapes for the reachability check, one per mode (libmemunreachable's tests, on a
// real process). unreachable MODE READY_FILE builds the shape, writes its pid to
// READY_FILE, then waits; on SIGUSR1 it checks that what it still holds is intact and
// exits 0 (status 3 if not). unreachable MODE exit exits at once instead (for valgrind).
// Pointers that must not be seen are kept hidden as their complement (~p).
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static volatile sig_atomic_t go;
static void on_usr1(int sig) { (void)sig; go = 1; }

static void *global_ptr;
static __thread void *tls_ptr;
static pthread_key_t key;
static void *interior;
static volatile int stop_spinning;

__attribute__((noinline)) static void *make(size_t n, int fill)
{
    void *p = malloc(n);
    memset(p, fill, n);
    return p;
}

// Allocates a node that points to `next` in its first word.
__attribute__((noinline)) static void **node(size_t n, void *next)
{
    void **p = make(n, 0x11);
    p[0] = next;
    return p;
}

static void *tls_thread(void *arg)
{
    (void)arg;
    tls_ptr = make(400, 0x44);
    pthread_setspecific(key, make(500, 0x55));
    while (!go)
        usleep(10000);
    return NULL;
}

// Holds a block only in r12 while it spins; the memory copy is the complement.
static void *register_thread(void *arg)
{
    uintptr_t hidden = (uintptr_t)arg;
    __asm__ volatile("movq %0, %%r12\n\t"
                     "notq %%r12\n"
                     "1:\tpause\n\t"
                     "cmpl $0, %1\n\t"
                     "je 1b\n\t"
                     "xorq %%r12, %%r12"
                     : : "r"(hidden), "m"(stop_spinning) : "r12", "memory");
    return NULL;
}

static int build(const char *mode, void **held)
{
    if (!strcmp(mode, "none")) {
        void *list = NULL;
        for (int i = 0; i < 10; i++)
            list = node(64, list);
        global_ptr = list;
    } else if (!strcmp(mode, "stack")) {
        held[0] = make(100, 0x22);                 // main's stack holds it
        void *volatile gone = make(104, 0x23);
        gone = NULL;                               // cleared: unreachable
        (void)gone;
    } else if (!strcmp(mode, "global")) {
        global_ptr = make(200, 0x33);
        make(300, 0x34);                           // never stored
    } else if (!strcmp(mode, "tls")) {
        pthread_t t;
        pthread_key_create(&key, NULL);
        tls_ptr = make(401, 0x45);                 // the main thread's TLS
        pthread_create(&t, NULL, tls_thread, NULL);
        usleep(200000);
    } else if (!strcmp(mode, "register")) {
        pthread_t t;
        void *p = make(600, 0x66);
        pthread_create(&t, NULL, register_thread, (void *)~(uintptr_t)p);
        p = NULL;
        usleep(200000);
    } else if (!strcmp(mode, "cycle")) {
        void **a = node(64, NULL), **b = node(64, a);
        a[0] = b;
    } else if (!strcmp(mode, "chain")) {
        node(32, node(32, node(32, NULL)));
    } else if (!strcmp(mode, "diamond")) {
        void **four = node(48, NULL);
        void **two = node(48, four), **three = node(48, four);
        void **one = node(48, two);
        one[1] = three;
    } else if (!strcmp(mode, "ring") || !strcmp(mode, "headed_ring")) {
        void **first = node(32, NULL), **last = first;
        for (int i = 1; i < 1000; i++)
            last = node(32, last);
        first[0] = last;                           // closes the ring of 1000
        if (!strcmp(mode, "headed_ring"))
            node(64, first);
    } else if (!strcmp(mode, "interior")) {
        interior = (char *)make(128, 0x77) + 100;  // only an interior pointer
    } else if (!strcmp(mode, "prot_none")) {
        void **page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        page[0] = make(700, 0x70);                 // held only from an unreadable page
        mprotect(page, 4096, PROT_NONE);
        global_ptr = make(800, 0x71);
    } else if (!strcmp(mode, "lots")) {
        for (int i = 0; i < 1024; i++)
            make(16, i);
    } else {
        return 0;
    }
    return 1;
}

// Zeroes the stack below main's frame: stale copies of pointers that build() left there
// would keep blocks alive in any conservative scan (printf and usleep reuse that memory).
__attribute__((noinline)) static void scrub_stack(void)
{
    volatile char area[65536];
    memset((char *)area, 0, sizeof area);
}

static int intact(const char *mode, void **held)
{
    if (!strcmp(mode, "stack"))
        return ((unsigned char *)held[0])[99] == 0x22;
    if (!strcmp(mode, "global"))
        return ((unsigned char *)global_ptr)[199] == 0x33;
    if (!strcmp(mode, "tls"))
        return ((unsigned char *)tls_ptr)[400] == 0x45;
    if (!strcmp(mode, "interior"))
        return ((unsigned char *)interior)[27] == 0x77;
    return 1;
}

int main(int argc, char **argv)
{
    void *held[1] = {0};
    const char *mode = argc > 1 ? argv[1] : "";
    signal(SIGUSR1, on_usr1);
    if (!build(mode, held)) {
        fprintf(stderr, "usage: unreachable MODE exit|READY_FILE\n");
        return 2;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: unreachable MODE exit|READY_FILE\n");
        return 2;
    }
    scrub_stack();
    if (!strcmp(argv[2], "exit"))
        exit(intact(mode, held) ? 0 : 3);
    FILE *ready = fopen(argv[2], "w");
    fprintf(ready, "%d\n", getpid());
    fclose(ready);
    while (!go)
        usleep(10000);
    stop_spinning = 1;
    return intact(mode, held) ? 0 : 3;
}
