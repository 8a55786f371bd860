// Names of frames for the library's own reports (backtrace_full's bt_info, the log's
// backtraces), as leaktrace names them from outside: the module's path as /proc/self/maps
// shows it, the pc as an address of the module's ELF file, and the function from .dynsym
// and .symtab (static functions and main included). All memory comes from one mmap'd
// arena per report: the library is at work, and must not allocate through the allocator.
#include "frame_names.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ARENA_SIZE (256UL << 20)  // address space reserved; pages are used as touched

struct function_symbol {
    uintptr_t value, size;
    const char *name;
    const char *readable;  // demangled name, once asked for (NULL: not yet)
    uint32_t order;        // position in .dynsym then .symtab (the earlier alias wins ties)
};

struct module {
    const char *path;
    const uint8_t *image;  // the file, mapped read-only; NULL if it could not be read
    size_t image_size;
    struct function_symbol *functions;  // sorted by value, one per address
    size_t count;
    struct module *next;  // every module opened for this report
};

struct mapping {
    uintptr_t start, end, offset;
    const char *path;
    struct module *module;
};

struct frame_names {
    char *arena;
    size_t used;
    struct mapping *mappings;  // as /proc/self/maps lists them (sorted by address)
    size_t mapping_count;
    struct module *modules;
    char *(*demangle)(const char *, char *, size_t *, int *);
};

static void *take(struct frame_names *names, size_t size)
{
    size_t start = (names->used + 15) & ~(size_t)15;  // aligned for any struct (text before it is not)
    if (start > ARENA_SIZE || size > ARENA_SIZE - start)
        return NULL;
    names->used = start + size;
    return names->arena + start;
}

// The whole of /proc/self/maps, NUL-terminated, at the arena's current end.
static char *read_maps(struct frame_names *names)
{
    int fd =
        open("/proc/thread-self/maps", O_RDONLY | O_CLOEXEC);  // self's reads empty once the first thread has exited
    if (fd < 0)
        return NULL;
    char *text = names->arena + names->used;
    size_t length = 0;
    ssize_t n;
    while (length + 4096 < ARENA_SIZE - names->used && (n = read(fd, text + length, 4096)) > 0)
        length += (size_t)n;
    close(fd);
    text[length] = 0;
    names->used += length + 1;
    return text;
}

static void parse_maps(struct frame_names *names, char *text)
{
    size_t lines = 0;
    for (const char *p = text; *p; p++)
        lines += *p == '\n';
    names->mappings = take(names, (lines + 1) * sizeof *names->mappings);
    if (!names->mappings)
        return;
    for (char *line = text, *next; *line; line = next) {
        next = strchr(line, '\n');
        next = next ? (*next = 0, next + 1) : line + strlen(line);
        char *p = line;
        struct mapping m = {0};
        m.start = strtoul(p, &p, 16);
        m.end = strtoul(p + 1, &p, 16);
        p = strchr(p + 1, ' ');  // past perms
        if (!p)
            continue;
        m.offset = strtoul(p + 1, &p, 16);
        for (int field = 0; field < 2 && p; field++)  // device, inode
            p = strchr(p + 1, ' ');
        if (!p)
            continue;
        while (*p == ' ')
            p++;
        m.path = p;
        names->mappings[names->mapping_count++] = m;
    }
}

static const struct mapping *mapping_of(const struct frame_names *names, uintptr_t pc)
{
    size_t low = 0, high = names->mapping_count;
    while (low < high) {
        size_t mid = low + (high - low) / 2;
        if (pc < names->mappings[mid].start)
            high = mid;
        else if (pc >= names->mappings[mid].end)
            low = mid + 1;
        else
            return &names->mappings[mid];
    }
    return NULL;
}

static int compare_functions(const void *left, const void *right)
{
    const struct function_symbol *a = left, *b = right;
    if (a->value != b->value)
        return a->value < b->value ? -1 : 1;
    // Among aliases: sized first, then a name without a leading '_' (malloc over __libc_malloc).
    if (a->size != b->size)
        return a->size > b->size ? -1 : 1;
    int ua = a->name[0] == '_', ub = b->name[0] == '_';
    if (ua != ub)
        return ua - ub;
    return (a->order > b->order) - (a->order < b->order);
}

static int within(const struct module *m, uint64_t offset, uint64_t size)
{
    return offset <= m->image_size && size <= m->image_size - offset;
}

// Counts the defined functions of .dynsym, then of .symtab, and stores them in out when it is
// given (their order of appearance settles ties between aliases).
static size_t collect_functions(const struct module *m, struct function_symbol *out)
{
    static const uint32_t tables[] = {SHT_DYNSYM, SHT_SYMTAB};
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)m->image;
    const Elf64_Shdr *sections = (const Elf64_Shdr *)(m->image + eh->e_shoff);
    size_t count = 0;
    for (size_t t = 0; t < sizeof tables / sizeof *tables; t++) {
        for (size_t s = 0; s < eh->e_shnum; s++) {
            const Elf64_Shdr *table = &sections[s];
            if (table->sh_type != tables[t] || table->sh_entsize != sizeof(Elf64_Sym) ||
                table->sh_link >= eh->e_shnum || !within(m, table->sh_offset, table->sh_size))
                continue;
            const Elf64_Shdr *strings = &sections[table->sh_link];
            const char *text = (const char *)m->image + strings->sh_offset;
            if (!strings->sh_size || !within(m, strings->sh_offset, strings->sh_size) || text[strings->sh_size - 1])
                continue;  // names must end inside their table
            const Elf64_Sym *symbols = (const Elf64_Sym *)(m->image + table->sh_offset);
            for (size_t i = 0; i < table->sh_size / sizeof(Elf64_Sym); i++) {
                const Elf64_Sym *sym = &symbols[i];
                int kind = ELF64_ST_TYPE(sym->st_info);
                if ((kind != STT_FUNC && kind != STT_GNU_IFUNC) || sym->st_shndx == SHN_UNDEF || !sym->st_value ||
                    sym->st_name >= strings->sh_size)
                    continue;
                if (out)
                    out[count] = (struct function_symbol){sym->st_value, sym->st_size, text + sym->st_name, NULL,
                                                          (uint32_t)count};
                count++;
            }
        }
    }
    return count;
}

// The defined functions of .dynsym and .symtab, sorted, one per address.
static void read_functions(struct frame_names *names, struct module *m)
{
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)m->image;
    if (!within(m, eh->e_shoff, (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr)) || eh->e_shentsize != sizeof(Elf64_Shdr))
        return;
    size_t total = collect_functions(m, NULL);
    if (!(m->functions = take(names, (total + 1) * sizeof *m->functions)))
        return;
    m->count = collect_functions(m, m->functions);
    qsort(m->functions, m->count, sizeof *m->functions, compare_functions);
    size_t kept = 0;
    for (size_t i = 0; i < m->count; i++)
        if (!kept || m->functions[kept - 1].value != m->functions[i].value)
            m->functions[kept++] = m->functions[i];
    m->count = kept;
}

// The module a file mapping belongs to: shared by every mapping of the same path.
static struct module *module_of(struct frame_names *names, struct mapping *mapping)
{
    if (mapping->module)
        return mapping->module;
    for (size_t i = 0; i < names->mapping_count; i++)
        if (names->mappings[i].module && !strcmp(names->mappings[i].path, mapping->path))
            return mapping->module = names->mappings[i].module;
    struct module *m = take(names, sizeof *m);
    if (!m)
        return NULL;
    memset(m, 0, sizeof *m);
    m->path = mapping->path;
    m->next = names->modules;
    names->modules = mapping->module = m;
    int fd = open(m->path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (size_t)st.st_size >= sizeof(Elf64_Ehdr)) {
        void *image = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        const Elf64_Ehdr *eh = image;
        if (image != MAP_FAILED && !memcmp(eh->e_ident, ELFMAG, SELFMAG) && eh->e_ident[EI_CLASS] == ELFCLASS64) {
            m->image = image;
            m->image_size = (size_t)st.st_size;
            read_functions(names, m);
        } else if (image != MAP_FAILED) {
            munmap(image, (size_t)st.st_size);
        }
    }
    if (fd >= 0)
        close(fd);
    return m;
}

// The link-time address a file offset is loaded at, from the PT_LOAD holding it; 0 if none.
static int file_offset_to_vaddr(const struct module *m, uintptr_t offset, uintptr_t *vaddr)
{
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)m->image;
    if (!within(m, eh->e_phoff, (uint64_t)eh->e_phnum * sizeof(Elf64_Phdr)) || eh->e_phentsize != sizeof(Elf64_Phdr))
        return 0;
    const Elf64_Phdr *segments = (const Elf64_Phdr *)(m->image + eh->e_phoff);
    for (size_t i = 0; i < eh->e_phnum; i++) {
        const Elf64_Phdr *s = &segments[i];
        if (s->p_type == PT_LOAD && s->p_offset <= offset && offset < s->p_offset + s->p_filesz) {
            *vaddr = offset - s->p_offset + s->p_vaddr;
            return 1;
        }
    }
    return 0;
}

static struct function_symbol *function_at(const struct module *m, uintptr_t vaddr)
{
    size_t low = 0, high = m->count;  // the last function starting at or below vaddr
    while (low < high) {
        size_t mid = low + (high - low) / 2;
        if (m->functions[mid].value <= vaddr)
            low = mid + 1;
        else
            high = mid;
    }
    if (!low)
        return NULL;
    struct function_symbol *f = &m->functions[low - 1];
    return f->size && vaddr >= f->value + f->size ? NULL : f;
}

struct frame_names *frame_names_open(void)
{
    char *arena = mmap(NULL, ARENA_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (arena == MAP_FAILED)
        return NULL;
    struct frame_names *names = (struct frame_names *)arena;
    memset(names, 0, sizeof *names);
    names->arena = arena;
    names->used = (sizeof *names + 15) & ~(size_t)15;
    names->demangle = (char *(*)(const char *, char *, size_t *, int *))dlsym(RTLD_DEFAULT, "__cxa_demangle");
    char *maps = read_maps(names);
    if (maps)
        parse_maps(names, maps);
    return names;
}

void frame_names_close(struct frame_names *names)
{
    if (!names)
        return;
    for (struct module *m = names->modules; m; m = m->next)
        if (m->image)
            munmap((void *)m->image, m->image_size);
    munmap(names->arena, ARENA_SIZE);
}

void frame_name(struct frame_names *names, uintptr_t pc, struct frame_name *out)
{
    *out = (struct frame_name){NULL, pc, NULL, 0};
    if (!names)
        return;
    struct mapping *mapping = (struct mapping *)mapping_of(names, pc);
    if (!mapping)
        return;
    out->module = mapping->path;
    if (mapping->path[0] != '/')
        return;
    struct module *m = module_of(names, mapping);
    uintptr_t vaddr;
    if (!m || !m->image || !file_offset_to_vaddr(m, pc - mapping->start + mapping->offset, &vaddr))
        return;
    out->rel_pc = vaddr;
    struct function_symbol *f = function_at(m, vaddr);
    if (!f)
        return;
    if (!f->readable) {  // demangled once, into the arena
        int status = -1;
        char *demangled = names->demangle ? names->demangle(f->name, NULL, NULL, &status) : NULL;
        char *copy = status == 0 && demangled ? take(names, strlen(demangled) + 1) : NULL;
        f->readable = copy ? strcpy(copy, demangled) : f->name;
        free(demangled);
    }
    out->function = f->readable;
    out->offset = vaddr - f->value;
}
