// A target whose design leans on its own signal state, for the in-process attach: main
// blocks every signal and waits for SIGUSR1 in sigwaitinfo (so a thread held there has
// SIGSEGV blocked), a worker unblocks SIGSEGV and keeps touching a guard page that its
// SIGSEGV handler opens (as a GC's write barrier or a JVM's guard pages do), and
// `coroutine` makes main wait in read() on a 4 KiB stack of its own instead. Prints
// "ready", then at SIGUSR1 (or at a byte on stdin, for the coroutine) "faults N" and exits 0.
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

static char *guard;
static long page;
static volatile long faults;

static void open_guard(int sig, siginfo_t *info, void *context)
{
    (void)sig, (void)context;
    char *at = (char *)((unsigned long)info->si_addr & ~(page - 1));
    if (at != guard)
        abort();
    mprotect(guard, page, PROT_READ | PROT_WRITE);
    faults++;
}

static void *touch_guard(void *unused)
{
    (void)unused;
    sigset_t segv;
    sigemptyset(&segv);
    sigaddset(&segv, SIGSEGV);
    pthread_sigmask(SIG_UNBLOCK, &segv, NULL);
    for (;;) {
        void *volatile block = malloc(64);
        free(block);
        mprotect(guard, page, PROT_NONE);
        guard[0]++;  // faults; the handler opens the page
        usleep(2000);
    }
    return NULL;
}

static ucontext_t main_context, small_context;

static void wait_on_small_stack(void)
{
    char byte;
    if (read(0, &byte, 1) < 0)
        perror("read");
}

int main(int argc, char **argv)
{
    page = sysconf(_SC_PAGESIZE);
    guard = mmap(NULL, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct sigaction handler = {.sa_sigaction = open_guard, .sa_flags = SA_SIGINFO};
    sigaction(SIGSEGV, &handler, NULL);
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    pthread_t worker;
    pthread_create(&worker, NULL, touch_guard, NULL);
    puts("ready");
    fflush(stdout);
    if (argc > 1 && !strcmp(argv[1], "coroutine")) {
        // 4 KiB of stack above a page no one may touch: an overflow faults off the guard page.
        char *small_stack = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        mprotect(small_stack, page, PROT_NONE);
        getcontext(&small_context);
        small_context.uc_stack = (stack_t){.ss_sp = small_stack + page, .ss_size = page};
        small_context.uc_link = &main_context;
        makecontext(&small_context, wait_on_small_stack, 0);
        swapcontext(&main_context, &small_context);
    } else {
        sigset_t usr1;
        sigemptyset(&usr1);
        sigaddset(&usr1, SIGUSR1);
        sigwaitinfo(&usr1, NULL);
    }
    printf("faults %ld\n", faults);
    fflush(stdout);
    return 0;
}
