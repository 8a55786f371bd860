// Five blocks of 4321 bytes from keep_some(), then no allocator call for argv[1]
// seconds (signals that cut a sleep short do not end the wait).
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

void *volatile kept[5];

__attribute__((noinline)) void keep_some(void)
{
    for (int i = 0; i < 5; i++)
        kept[i] = malloc(4321);
}

int main(int argc, char **argv)
{
    keep_some();
    time_t end = time(NULL) + (argc > 1 ? atoi(argv[1]) : 1);
    while (time(NULL) < end)
        sleep(1);
    return 0;
}
