// early_byte: writes a byte to fd 900, where leaktrace's in-process gate hears a command say it
// is held at its exit, and so does a child it forks; then, 0.5 s later, loses 5 blocks of 64
// bytes and exits. A gate that judged at the byte would judge before the leak.
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline)) static void lose(int count)
{
    for (int i = 0; i < count; i++) {
        void *volatile block = malloc(64);
        memset(block, i, 64);
    }
}

int main(void)
{
    char byte = 1;
    pid_t child = fork();
    if (write(900, &byte, 1) < 0 && child == 0)
        _exit(1);
    if (child == 0)
        _exit(0);
    waitpid(child, NULL, 0);
    struct timespec half = {0, 500000000};
    nanosleep(&half, NULL);
    lose(5);
    return 0;
}
