// poisoned_name: a block of 4242 bytes made in poisoned(), inlined into outer(); the test
// renames poisoned in the DWARF to a name with newlines and blank lines, which must not
// shift any frame of the stack onto another answer of the symbolizer.
#include <stdlib.h>
static inline __attribute__((always_inline)) void *poisoned(void) { return malloc(4242); }
__attribute__((noinline)) void *outer(void) { return poisoned(); }
int main(void) { void *volatile kept = outer(); (void)kept; return 0; }
