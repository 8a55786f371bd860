/* 50 leaked blocks of 16 bytes from four call sites: 10, 10, 10 and 20. */
#include <stdlib.h>

void *volatile keep[64];
static int kept;

__attribute__((noinline)) void site_a(void) { keep[kept++] = malloc(16); }
__attribute__((noinline)) void site_b(void) { keep[kept++] = malloc(16); }
__attribute__((noinline)) void site_c(void) { keep[kept++] = malloc(16); }
__attribute__((noinline)) void site_d(void) { keep[kept++] = malloc(16); }

int main(void)
{
    for (int i = 0; i < 10; i++) site_a();
    for (int i = 0; i < 10; i++) site_b();
    for (int i = 0; i < 10; i++) site_c();
    for (int i = 0; i < 20; i++) site_d();
    return 0;
}
