// fake_python: a C program that exports what leaktrace's library checks to take a process
// for CPython 3.11 (Py_Version, a PyCode_Type named "code" with 3.11's sizes, and
// PyGILState_GetThisThreadState), built as python3.11, whose thread state leads nowhere: a
// frame chain through unmapped memory, then one that ends in a page of garbage. It keeps
// 100 blocks of 4321 bytes made in make() and exits 0: the walk must never fault it.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef FAKE_VERSION
#define FAKE_VERSION 0x030b04f0  // -DFAKE_VERSION=...: another version's (an unknown one's, in a test)
#endif
#ifndef FAKE_CODE_SIZE
#define FAKE_CODE_SIZE 0xb8  // 3.11's code objects; -DFAKE_CODE_SIZE=0xc0 with 3.12's version
#endif
const unsigned long Py_Version = FAKE_VERSION;
struct {
    char head[24];
    const char *name;
    intptr_t basic_size, item_size;
} PyCode_Type = {{0}, "code", FAKE_CODE_SIZE, 2};

static uintptr_t thread_state[16], cframe[2];

uintptr_t PyGILState_GetThisThreadState(void)
{
    return (uintptr_t)thread_state;
}

static void *volatile kept[100];

__attribute__((noinline)) static void make(int from, int to)
{
    for (int i = from; i < to; i++)
        kept[i] = malloc(4321);
}

int main(void)
{
#ifdef FAKE_SHIM_LOOP
    // As 3.12 (-DFAKE_VERSION=0x030c01f0 -DFAKE_CODE_SIZE=0xc0): the current frame (cframe's
    // first word) is an eval-loop shim (owner 3 at 0x46) whose previous frame (at 8) is itself.
    static uintptr_t shim[16];
    ((unsigned char *)shim)[0x46] = 3;
    shim[1] = (uintptr_t)shim;
    thread_state[0x38 / 8] = (uintptr_t)cframe;
    cframe[0] = (uintptr_t)shim;
    make(0, 100);
    puts("done");
    return 0;
#endif
    long page = sysconf(_SC_PAGESIZE);
    thread_state[0x38 / 8] = (uintptr_t)cframe;
    cframe[1] = 0xdead0000;  // the current frame: unmapped
    make(0, 50);
    // A frame in a page of garbage: its code and previous frame point at unmapped memory.
    uintptr_t *garbage = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(garbage, 0x41, page);
    garbage[0x20 / 8] = 0xbeef000;  // f_code
    cframe[1] = (uintptr_t)garbage;
    make(50, 75);
    garbage[0x20 / 8] = (uintptr_t)garbage + page - 8;  // a code object running off the page
    make(75, 100);
    puts("done");
    return 0;
}
