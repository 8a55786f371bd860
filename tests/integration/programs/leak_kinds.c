// Blocks of each of valgrind's leak kinds at exit, made by the main thread and by a second
// one (so two arenas), each in a function of its own:
//   definite_block  100 definitely lost
//   lost_list       48 definitely lost (the head), 2 x 48 indirectly lost (the rest)
//   lost_cycle      64 definitely lost, 64 indirectly lost (a two-block cycle nobody holds)
//   possible_block  200 possibly lost (only a pointer 16 bytes in is kept)
//   reachable_block 300 still reachable (a global holds it)
//   thread_blocks   3 x 24 definitely lost and 1 x 32 still reachable, by the thread
// The stack below each call is scrubbed, so no stale copy of a pointer stays behind. With an
// argument, it then says "ready" (no stdio: its buffer would be one more block) and waits.
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "leak_blocks.h"

struct node {
    struct node *next;
    char pad[40];
};

void *volatile kept_start;
char *volatile kept_interior;
void *volatile kept_by_thread;

__attribute__((noinline)) static void definite_block(void) { make(100); }

__attribute__((noinline)) static void lost_list(void)
{
    struct node *head = make(sizeof *head);
    head->next = make(sizeof *head);
    head->next->next = make(sizeof *head);
}

__attribute__((noinline)) static void lost_cycle(void)
{
    struct node *a = make(64), *b = make(64);
    a->next = b;
    b->next = a;
}

__attribute__((noinline)) static void possible_block(void) { kept_interior = (char *)make(200) + 16; }

__attribute__((noinline)) static void reachable_block(void) { kept_start = make(300); }

__attribute__((noinline)) static void thread_blocks(void)
{
    for (int i = 0; i < 3; i++)
        make(24);
    kept_by_thread = make(32);
}

static void *thread_body(void *unused)
{
    thread_blocks();
    scrub();
    return unused;
}

int main(int argc, char **argv)
{
    (void)argv;
    pthread_t thread;
    if (pthread_create(&thread, NULL, thread_body, NULL) != 0 || pthread_join(thread, NULL) != 0)
        return 1;
    definite_block();
    lost_list();
    lost_cycle();
    possible_block();
    reachable_block();
    scrub();
    if (argc > 1 && write(1, "ready\n", 6) == 6)
        for (;;)
            pause();
    return 0;
}
