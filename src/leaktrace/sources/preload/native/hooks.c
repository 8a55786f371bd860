// Attached to a running process (leaktrace -p PID --engine preload): leaktrace has made the
// process dlopen this library and call leaktrace_attach, which points every module's GOT
// slots of the malloc family (JUMP_SLOT and GLOB_DAT) at the library's entry points, as a
// preload would have bound them; modules loaded later are patched by a watcher thread within
// WATCH_MS of their dlopen. leaktrace_detach puts every slot back. The watcher also detaches
// when leaktrace itself goes, however it ended: leaktrace holds the only write end of a pipe
// whose read end it hands in, which hangs up then (a pidfd could not name leaktrace from
// inside another PID namespace).
#include "malloc_debug.h"
#include "stacks.h"
#include "table.h"

#include "arch.h"

#include <elf.h>
#include <link.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define WATCH_MS 20

struct patched_slot {
    void **slot;
    void *original;
    int read_only;  // in the module's read-only-after-relocation part
};

static pthread_mutex_t patch_lock = PTHREAD_MUTEX_INITIALIZER;
static struct patched_slot *patched;  // on glibc's heap: the library's bookkeeping
static size_t patched_count, patched_room;
static unsigned long long modules_seen;  // dl_iterate_phdr's count of modules added, at the last patch
static int attached;
static unsigned attach_generation;  // a watcher of an earlier attach ends when this moves on

static void *replacement_of(const char *name)
{
    for (const struct replacement *r = replacements; r->name; r++)
        if (!strcmp(r->name, name))
            return r->function;
    return NULL;
}

// Writes value into a GOT slot; a read-only one has its page made writable for the write.
static int write_slot(void **slot, void *value, int read_only)
{
    uintptr_t page_size = (uintptr_t)sysconf(_SC_PAGESIZE), page = (uintptr_t)slot & ~(page_size - 1);
    if (read_only && mprotect((void *)page, page_size, PROT_READ | PROT_WRITE))
        return 0;
    __atomic_store_n(slot, value, __ATOMIC_RELEASE);
    if (read_only)
        mprotect((void *)page, page_size, PROT_READ);
    return 1;
}

static int remember(struct patched_slot slot)
{
    if (patched_count == patched_room) {
        size_t room = patched_room ? patched_room * 2 : 256;
        struct patched_slot *bigger = own_realloc(patched, room * sizeof *bigger);
        if (!bigger)
            return 0;
        patched = bigger, patched_room = room;
    }
    patched[patched_count++] = slot;
    return 1;
}

struct module_view {
    uintptr_t bias, relro_start, relro_end;
    const ElfW(Sym) * symbols;
    const char *strings;
    size_t strings_size;
};

// A dynamic-section address: ld.so has relocated most of them in place; a small one is not.
static uintptr_t dynamic_address(const struct module_view *m, uintptr_t value)
{
    return value < m->bias ? value + m->bias : value;
}

static void patch_relocations(const struct module_view *m, const ElfW(Rela) * relocations, size_t size)
{
    for (size_t i = 0; relocations && i < size / sizeof *relocations; i++) {
        unsigned type = ELF64_R_TYPE(relocations[i].r_info), symbol = ELF64_R_SYM(relocations[i].r_info);
        if ((type != ARCH_JUMP_SLOT && type != ARCH_GLOB_DAT) || !symbol)
            continue;
        uint32_t name = m->symbols[symbol].st_name;
        void *function = name < m->strings_size ? replacement_of(m->strings + name) : NULL;
        void **slot = (void **)(m->bias + relocations[i].r_offset);
        void *current = function ? __atomic_load_n(slot, __ATOMIC_ACQUIRE) : NULL;
        if (!function || current == function)
            continue;
        // ld.so makes the whole pages of PT_GNU_RELRO read-only, the last partial one excepted.
        uintptr_t page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
        int read_only = (uintptr_t)slot >= (m->relro_start & ~(page_size - 1)) &&
                        (uintptr_t)slot < (m->relro_end & ~(page_size - 1));
        if (remember((struct patched_slot){slot, current, read_only}) && !write_slot(slot, function, read_only))
            patched_count--;  // left as it was: nothing to put back
    }
}

static int patch_module(struct dl_phdr_info *info, size_t size, void *own_code)
{
    (void)size;
    struct module_view m = {.bias = info->dlpi_addr};
    const ElfW(Dyn) *dynamic = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *p = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + p->p_vaddr;
        if (p->p_type == PT_LOAD && (uintptr_t)own_code >= start && (uintptr_t)own_code < start + p->p_memsz)
            return 0;  // this library: its calls are its own
        if (p->p_type == PT_DYNAMIC)
            dynamic = (const ElfW(Dyn) *)start;
        if (p->p_type == PT_GNU_RELRO)
            m.relro_start = start, m.relro_end = start + p->p_memsz;
    }
    if (!dynamic || !info->dlpi_name || !strncmp(info->dlpi_name, "linux-vdso", 10))
        return 0;
    const ElfW(Rela) *plt = NULL, *rela = NULL;
    size_t plt_size = 0, rela_size = 0;
    for (const ElfW(Dyn) *d = dynamic; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB:
            m.symbols = (const ElfW(Sym) *)dynamic_address(&m, d->d_un.d_ptr);
            break;
        case DT_STRTAB:
            m.strings = (const char *)dynamic_address(&m, d->d_un.d_ptr);
            break;
        case DT_STRSZ:
            m.strings_size = d->d_un.d_val;
            break;
        case DT_JMPREL:
            plt = (const ElfW(Rela) *)dynamic_address(&m, d->d_un.d_ptr);
            break;
        case DT_PLTRELSZ:
            plt_size = d->d_un.d_val;
            break;
        case DT_RELA:
            rela = (const ElfW(Rela) *)dynamic_address(&m, d->d_un.d_ptr);
            break;
        case DT_RELASZ:
            rela_size = d->d_un.d_val;
            break;
        }
    }
    if (!m.symbols || !m.strings)
        return 0;
    patch_relocations(&m, plt, plt_size);
    patch_relocations(&m, rela, rela_size);
    return 0;
}

static int count_modules(struct dl_phdr_info *info, size_t size, void *seen)
{
    (void)size;
    *(unsigned long long *)seen = info->dlpi_adds;
    return 1;  // the count is the same in every call: one is enough
}

static void patch_every_module(void)
{
    pthread_mutex_lock(&patch_lock);
    if (attached) {
        dl_iterate_phdr(count_modules, &modules_seen);
        dl_iterate_phdr(patch_module, (void *)patch_every_module);
    }
    pthread_mutex_unlock(&patch_lock);
}

static void restore_every_slot(void)
{
    pthread_mutex_lock(&patch_lock);
    attached = 0;
    attach_generation++;
    // Each slot back, from the last patched to the first.
    for (; patched_count; patched_count--) {
        struct patched_slot *p = &patched[patched_count - 1];
        write_slot(p->slot, p->original, p->read_only);
    }
    pthread_mutex_unlock(&patch_lock);
    stop_attached();
}

struct watch {
    int leaktrace;  // read end of the pipe the attaching leaktrace writes to, or -1
    unsigned generation;
};

// Patches modules dlopen'ed since the last look, until the detach or leaktrace's end.
static void *watch_modules(void *argument)
{
    struct watch watch = *(struct watch *)argument;
    own_free(argument);
    for (;;) {
        struct pollfd gone = {.fd = watch.leaktrace, .events = POLLIN};
        int ended = poll(&gone, watch.leaktrace >= 0, WATCH_MS) > 0;
        if (__atomic_load_n(&attach_generation, __ATOMIC_ACQUIRE) != watch.generation)
            break;
        if (ended) {
            restore_every_slot();
            break;
        }
        unsigned long long adds = 0;
        dl_iterate_phdr(count_modules, &adds);
        if (adds != __atomic_load_n(&modules_seen, __ATOMIC_RELAXED))
            patch_every_module();
    }
    if (watch.leaktrace >= 0)
        close(watch.leaktrace);
    return NULL;
}

// 0 when attached; 1 bad options (or ones that change blocks); 2 already attached; 3 no watcher
// thread; 4 no room for the sampler. The watch descriptor is the library's from here on, closed
// on every failure. sample_bytes: --sample's rate (0: every call), seed its generator's.
EXPORT int leaktrace_attach(const char *options, int leaktrace_watch, size_t sample_bytes, uint64_t seed)
{
    struct watch *watch = NULL;
    int refused = __atomic_load_n(&attached, __ATOMIC_ACQUIRE) ? 2
                  : !start_sampling(sample_bytes, seed)        ? 4
                  : !start_attached(options)                   ? 1
                                                               : 0;
    if (!refused && !(watch = own_malloc(sizeof *watch)))
        refused = 3;
    if (refused) {
        if (leaktrace_watch >= 0)
            close(leaktrace_watch);
        return refused;
    }
    pthread_t thread;
    pthread_attr_t detached;
    pthread_mutex_lock(&patch_lock);
    attached = 1;
    *watch = (struct watch){leaktrace_watch, attach_generation};
    pthread_mutex_unlock(&patch_lock);
    patch_every_module();
    pthread_attr_init(&detached);
    pthread_attr_setdetachstate(&detached, PTHREAD_CREATE_DETACHED);
    int failed = pthread_create(&thread, &detached, watch_modules, watch);
    pthread_attr_destroy(&detached);
    if (failed) {
        if (watch->leaktrace >= 0)
            close(watch->leaktrace);
        own_free(watch);
        restore_every_slot();
        return 3;
    }
    return 0;
}

EXPORT int leaktrace_detach(void)
{
    restore_every_slot();
    return 0;
}
