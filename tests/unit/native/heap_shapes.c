/* A glibc heap of known shape for the heap walk's unit test: in the main arena, blocks of
 * 16..1600 bytes with every third freed (tcache, fastbins, unsorted and small bins), and two
 * mmapped blocks; in a second arena, a thread's blocks, half of them freed. Every allocation
 * and free is done before the first line is printed (stdout's buffer is made first), so no
 * later allocation takes a freed block's place. It prints each block it keeps ("kept ADDRESS
 * SIZE") and each it freed ("freed ADDRESS"), then "ready", and waits to be killed. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define MAIN_BLOCKS 100
#define THREAD_BLOCKS 40
#define MMAPPED 2
#define ALL (MAIN_BLOCKS + THREAD_BLOCKS + MMAPPED)

static void *blocks[ALL];
static int sizes[ALL], freed[ALL];

static void make(int first, int count, int step)
{
    for (int i = 0; i < count; i++) {
        sizes[first + i] = step * (i + 1);
        blocks[first + i] = malloc((size_t)sizes[first + i]);
    }
}

static void release(int first, int count, int every)
{
    for (int i = 0; i < count; i += every) {
        free(blocks[first + i]);
        freed[first + i] = 1;
    }
}

static void *in_thread(void *unused)
{
    make(MAIN_BLOCKS, THREAD_BLOCKS, 24);
    release(MAIN_BLOCKS, THREAD_BLOCKS, 2);
    return unused;
}

int main(void)
{
    setvbuf(stdout, malloc(BUFSIZ), _IOFBF, BUFSIZ);
    make(0, MAIN_BLOCKS, 16);
    make(MAIN_BLOCKS + THREAD_BLOCKS, MMAPPED, 200000);
    pthread_t thread;
    pthread_create(&thread, NULL, in_thread, NULL);
    pthread_join(thread, NULL);
    release(0, MAIN_BLOCKS, 3);
    for (int i = 0; i < ALL; i++) {
        if (freed[i])
            printf("freed %p\n", blocks[i]);
        else
            printf("kept %p %d\n", blocks[i], sizes[i]);
    }
    printf("ready\n");
    fflush(stdout);
    for (;;)
        pause();
}
