// The CFI interpreter both engines use: the preload library's walk asks for the rule at one pc
// of its own process (.eh_frame_hdr's sorted table finds the FDE, whose instructions run up to
// that pc); unwind/tables.py has every row of a module file's .eh_frame compiled for the BPF
// walk. The rule kept is what rows.h's walk needs, where it describes the machine's frames
// (arch.h: ARCH_ROWS_WALK). A file is untrusted input: every read of it is bounded by the
// section, and no pointer in it is followed.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "cfi.h"

#include "arch.h"

#include <dlfcn.h>
#include <string.h>

#ifdef __GLIBC__
#pragma weak _dl_find_object  // glibc 2.35 and later: before, every stack is libgcc's

int cfi_usable(void)
{
    return _dl_find_object != NULL;
}

// The .eh_frame_hdr of the module holding pc, or NULL.
static const uint8_t *eh_frame_header(uintptr_t pc)
{
    struct dl_find_object object;
    return _dl_find_object((void *)pc, &object) == 0 ? object.dlfo_eh_frame : NULL;
}
#else
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <unistd.h>

int cfi_usable(void)
{
    return 1;
}

#define SEGMENTS_KEPT 8
// The module holding a pc, as dl_iterate_phdr shows it. musl has no _dl_find_object, and its
// dl_iterate_phdr neither allocates nor takes a lock that a call into the allocator may hold.
struct module_search {
    uintptr_t pc;
    const uint8_t *header;  // its .eh_frame_hdr (Debian's musl-gcc links none)
    uintptr_t bias;
    const char *path;
    uintptr_t segments[SEGMENTS_KEPT][2];  // its readable PT_LOADs, [start, end)
    int visited, found;
};

static int module_if_holding(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct module_search *search = data;
    const uint8_t *header = NULL;
    int holds = 0, kept = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && search->pc >= start && search->pc - start < ph->p_memsz)
            holds = 1;
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_R) && kept < SEGMENTS_KEPT) {
            search->segments[kept][0] = start;
            search->segments[kept++][1] = start + ph->p_memsz;
        } else if (ph->p_type == PT_GNU_EH_FRAME)
            header = (const uint8_t *)start;
    }
    if (holds) {
        for (; kept < SEGMENTS_KEPT; kept++)
            search->segments[kept][0] = search->segments[kept][1] = 0;
        search->header = header;
        search->bias = info->dlpi_addr;
        search->path = search->visited ? info->dlpi_name : "/proc/self/exe";  // the program is first
        search->found = 1;
    }
    search->visited++;
    return holds;
}

static const uint8_t *eh_frame_header(uintptr_t pc)
{
    struct module_search search = {.pc = pc};
    dl_iterate_phdr(module_if_holding, &search);
    return search.header;
}

// A module's .eh_frame as its file's section headers place it, inside one of its readable segments.
struct eh_frame_section {
    uintptr_t bias;
    char path[256];
    const uint8_t *start;
    size_t size;
};

static int read_eh_frame(const struct module_search *module, struct eh_frame_section *out)
{
    int fd = open(module->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ElfW(Ehdr) ehdr;
    ElfW(Shdr) strings, shdr;
    int found = 0;
    if (pread(fd, &ehdr, sizeof ehdr, 0) == sizeof ehdr && !memcmp(ehdr.e_ident, ELFMAG, SELFMAG) &&
        ehdr.e_shentsize == sizeof shdr && ehdr.e_shstrndx < ehdr.e_shnum &&
        pread(fd, &strings, sizeof strings, ehdr.e_shoff + ehdr.e_shstrndx * sizeof shdr) == sizeof strings) {
        for (unsigned i = 0; i < ehdr.e_shnum && i < 1024 && !found; i++) {
            char name[sizeof ".eh_frame"];
            found = pread(fd, &shdr, sizeof shdr, ehdr.e_shoff + i * sizeof shdr) == sizeof shdr &&
                    shdr.sh_name < strings.sh_size && (shdr.sh_flags & SHF_ALLOC) &&
                    pread(fd, name, sizeof name, strings.sh_offset + shdr.sh_name) == sizeof name &&
                    !memcmp(name, ".eh_frame", sizeof name);
        }
    }
    close(fd);
    uintptr_t start = module->bias + shdr.sh_addr;
    for (int i = 0; found && i < SEGMENTS_KEPT; i++)
        if (start >= module->segments[i][0] && shdr.sh_size <= module->segments[i][1] - start) {
            *out =
                (struct eh_frame_section){.bias = module->bias, .start = (const uint8_t *)start, .size = shdr.sh_size};
            strncpy(out->path, module->path, sizeof out->path - 1);
            return 1;
        }
    return 0;
}

#define SECTIONS_KEPT 64
static struct eh_frame_section sections[SECTIONS_KEPT];
static unsigned sections_kept;
static int sections_lock;

// The .eh_frame of the module holding pc when it has no .eh_frame_hdr (read once from its file).
// The cache's lock is only ever tried, never waited for: a fork or a signal handler that finds
// it taken reads the file again instead of waiting on a holder that may never give it back.
static int eh_frame_section(uintptr_t pc, struct eh_frame_section *out)
{
    struct module_search search = {.pc = pc};
    dl_iterate_phdr(module_if_holding, &search);
    if (!search.found || search.header)
        return 0;
    int found = 0;
    if (!__atomic_exchange_n(&sections_lock, 1, __ATOMIC_ACQUIRE)) {
        for (unsigned i = 0; i < sections_kept && !found; i++)
            if (sections[i].bias == search.bias &&
                !strncmp(sections[i].path, search.path, sizeof sections[i].path - 1)) {
                *out = sections[i];
                found = 1;
            }
        __atomic_store_n(&sections_lock, 0, __ATOMIC_RELEASE);
    }
    if (found)
        return 1;
    if (!read_eh_frame(&search, out))
        return 0;
    if (!__atomic_exchange_n(&sections_lock, 1, __ATOMIC_ACQUIRE)) {
        if (sections_kept < SECTIONS_KEPT)  // beyond, read again each time
            sections[sections_kept++] = *out;
        __atomic_store_n(&sections_lock, 0, __ATOMIC_RELEASE);
    }
    return 1;
}
#endif

#define DWARF_RBP ARCH_DWARF_FP
#define DWARF_RSP ARCH_DWARF_SP
#define DWARF_RA ARCH_DWARF_RA
#define REMEMBERED_MAX 8  // DW_CFA_remember_state nesting followed; deeper gives an unknown rule

// Where CFI is read: this process's own memory, or a copy of a file's .eh_frame, bounded, whose
// bytes are at an address bias away from where the file's code expects them when loaded.
struct image {
    const uint8_t *start, *end;
    uintptr_t bias;
    int in_memory;  // pointers may be followed (DW_EH_PE_indirect)
};
static const struct image own_memory = {NULL, (const uint8_t *)UINTPTR_MAX, 0, 1};

struct reader {
    const uint8_t *at, *end;
    const struct image *image;
    int bad;  // read past the end, or an encoding not handled
};

static uint64_t read_uleb(struct reader *r)
{
    uint64_t value = 0;
    for (unsigned shift = 0; r->at < r->end; shift += 7) {
        uint8_t byte = *r->at++;
        if (shift < 64)
            value |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80))
            return value;
    }
    r->bad = 1;
    return 0;
}

static int64_t read_sleb(struct reader *r)
{
    int64_t value = 0;
    unsigned shift = 0;
    while (r->at < r->end) {
        uint8_t byte = *r->at++;
        if (shift < 64)
            value |= (int64_t)((uint64_t)(byte & 0x7f) << shift);
        shift += 7;
        if (!(byte & 0x80)) {
            if (shift < 64 && (byte & 0x40))
                value |= -((int64_t)1 << shift);
            return value;
        }
    }
    r->bad = 1;
    return 0;
}

// n bytes, little-endian, zero-extended; the caller sign-extends.
static uint64_t read_fixed(struct reader *r, size_t n)
{
    uint64_t value = 0;
    if ((size_t)(r->end - r->at) < n) {
        r->bad = 1;
        return 0;
    }
    memcpy(&value, r->at, n);
    r->at += n;
    return value;
}

// A DW_EH_PE_* encoded pointer; datarel is counted from data_base.
static uintptr_t read_encoded(struct reader *r, uint8_t encoding, uintptr_t data_base)
{
    if (encoding == 0xff)  // DW_EH_PE_omit
        return 0;
    uintptr_t base;
    switch (encoding & 0x70) {
    case 0x00:
        base = 0;
        break;
    case 0x10:
        base = (uintptr_t)r->at + r->image->bias;  // pcrel: from the field itself
        break;
    case 0x30:
        base = data_base;
        break;
    default:  // textrel, funcrel, aligned: not made by x86-64 toolchains
        r->bad = 1;
        return 0;
    }
    uint64_t value;
    switch (encoding & 0x0f) {
    case 0x00:
    case 0x04:
        value = read_fixed(r, 8);
        break;
    case 0x01:
        value = read_uleb(r);
        break;
    case 0x02:
        value = read_fixed(r, 2);
        break;
    case 0x03:
        value = read_fixed(r, 4);
        break;
    case 0x09:
        value = (uint64_t)read_sleb(r);
        break;
    case 0x0a:
        value = (uint64_t)(int64_t)(int16_t)read_fixed(r, 2);
        break;
    case 0x0b:
        value = (uint64_t)(int64_t)(int32_t)read_fixed(r, 4);
        break;
    case 0x0c:
        value = read_fixed(r, 8);
        break;
    default:
        r->bad = 1;
        return 0;
    }
    uintptr_t result = base + (uintptr_t)value;
    if ((encoding & 0x80) && !r->image->in_memory)  // DW_EH_PE_indirect: not in a file
        r->bad = 1;
    else if ((encoding & 0x80) && !r->bad)
        memcpy(&result, (const void *)result, sizeof result);
    return result;
}

// A CIE or FDE's extent: its length field (32 or 64 bits) read, r->end set to its end; 0 for
// the zero length that ends a section, or an entry that does not fit in the image.
static int enter_entry(struct reader *r, const uint8_t *entry, const struct image *image)
{
    if (entry < image->start || entry >= image->end)
        return 0;
    r->at = entry;
    r->end = (uintptr_t)image->end - (uintptr_t)entry < 12 ? image->end : entry + 12;
    r->image = image;
    r->bad = 0;
    uint64_t length = read_fixed(r, 4);
    if (length == 0xffffffffu)
        length = read_fixed(r, 8);
    if (!length || r->bad || length > (1u << 30) || length > (uintptr_t)image->end - (uintptr_t)r->at)
        return 0;
    r->end = r->at + length;
    return 1;
}

struct cie {
    uint64_t code_align;
    int64_t data_align;
    uint8_t fde_encoding;
    uint8_t has_augmentation_data;
    uint8_t signal_frame;
    struct reader instructions;
};

static int read_cie(const uint8_t *entry, const struct image *image, struct cie *cie)
{
    struct reader r;
    if (!enter_entry(&r, entry, image) || read_fixed(&r, 4) != 0)  // a CIE's id in .eh_frame is 0
        return 0;
    uint8_t version = (uint8_t)read_fixed(&r, 1);
    const char *augmentation = (const char *)r.at;
    size_t length = strnlen(augmentation, (size_t)(r.end - r.at));
    if (r.bad || length == (size_t)(r.end - r.at))
        return 0;  // no end to the string within the entry
    r.at += length + 1;
    if (strstr(augmentation, "eh"))
        read_fixed(&r, 8);  // an old GCC's pointer to exception tables
    cie->code_align = read_uleb(&r);
    cie->data_align = read_sleb(&r);
    if (version == 1)
        read_fixed(&r, 1);
    else
        read_uleb(&r);  // the return address column: 16 on x86-64, taken as such
    cie->fde_encoding = 0;
    cie->signal_frame = 0;
    cie->has_augmentation_data = augmentation[0] == 'z';
    if (cie->has_augmentation_data) {
        uint64_t data_length = read_uleb(&r);
        if (r.bad || data_length > (uint64_t)(r.end - r.at))
            return 0;
        const uint8_t *data_end = r.at + data_length;
        for (const char *c = augmentation + 1; *c && !r.bad; c++) {
            if (*c == 'R')
                cie->fde_encoding = (uint8_t)read_fixed(&r, 1);
            else if (*c == 'P')  // the personality routine: skipped, never followed
                read_encoded(&r, (uint8_t)(read_fixed(&r, 1) & 0x7f), 0);
            else if (*c == 'L')
                read_fixed(&r, 1);
            else if (*c == 'S')
                cie->signal_frame = 1;
            else
                break;  // the length says where the data ends
        }
        r.at = data_end;
    } else if (augmentation[0] && strcmp(augmentation, "eh") != 0) {
        return 0;  // an augmentation whose data cannot be skipped
    }
    cie->instructions = r;
    return !r.bad && r.at <= r.end;
}

// How a register is found: as on entry, or at CFA+offset, or some way not followed.
enum how { SAME, UNDEFINED, AT_OFFSET, OTHER };

struct register_rule {
    uint8_t how;
    int64_t offset;
};

struct frame_state {
    uint64_t cfa_register;
    int64_t cfa_offset;
    int cfa_by_expression;
    struct register_rule rbp, ra;
};

struct interpreter {
    struct frame_state state, initial;
    struct frame_state remembered[REMEMBERED_MAX];
    int depth;
    uintptr_t location, target;
    const struct cie *cie;
    // Called with the rule in force from in->location on, before each move to a later row.
    void (*emit)(struct interpreter *in);
    void *emit_to;
};

static struct register_rule *followed(struct frame_state *state, uint64_t reg)
{
    return reg == DWARF_RBP ? &state->rbp : reg == DWARF_RA ? &state->ra : NULL;
}

static void set_rule(struct frame_state *state, uint64_t reg, uint8_t how, int64_t offset)
{
    struct register_rule *rule = followed(state, reg);
    if (rule)
        *rule = (struct register_rule){how, offset};
}

static void restore_rule(struct interpreter *in, uint64_t reg)
{
    struct register_rule *rule = followed(&in->state, reg);
    if (rule)
        *rule = *followed(&in->initial, reg);
}

static void skip_block(struct reader *r)
{
    uint64_t length = read_uleb(r);
    if (length > (uint64_t)(r->end - r->at))
        r->bad = 1;
    else
        r->at += length;
}

// 1 when the next row starts past the target: the rule in force is the one built so far.
static int advance(struct interpreter *in, uintptr_t location)
{
    if (location > in->target)
        return 1;
    if (in->emit)
        in->emit(in);
    in->location = location;
    return 0;
}

// Runs instructions until the row covering in->target is complete; 0 on a malformed program.
static int run(struct interpreter *in, struct reader *r, uintptr_t data_base)
{
    const struct cie *cie = in->cie;
    struct frame_state *s = &in->state;
    while (r->at < r->end && !r->bad) {
        uint8_t op = *r->at++;
        uint8_t low = op & 0x3f;
        switch (op >> 6) {
        case 1:  // DW_CFA_advance_loc
            if (advance(in, in->location + low * cie->code_align))
                return 1;
            continue;
        case 2:  // DW_CFA_offset
            set_rule(s, low, AT_OFFSET, (int64_t)read_uleb(r) * cie->data_align);
            continue;
        case 3:  // DW_CFA_restore
            restore_rule(in, low);
            continue;
        }
        uint64_t reg;
        switch (op) {
        case 0x00:  // nop
            break;
        case 0x01:  // set_loc
            if (advance(in, read_encoded(r, cie->fde_encoding, data_base)))
                return 1;
            break;
        case 0x02:  // advance_loc1, 2, 4
        case 0x03:
        case 0x04:
            if (advance(in, in->location + read_fixed(r, op == 0x02 ? 1 : op == 0x03 ? 2 : 4) * cie->code_align))
                return 1;
            break;
        case 0x05:  // offset_extended
            reg = read_uleb(r);
            set_rule(s, reg, AT_OFFSET, (int64_t)read_uleb(r) * cie->data_align);
            break;
        case 0x06:  // restore_extended
            restore_rule(in, read_uleb(r));
            break;
        case 0x07:  // undefined
            set_rule(s, read_uleb(r), UNDEFINED, 0);
            break;
        case 0x08:  // same_value
            set_rule(s, read_uleb(r), SAME, 0);
            break;
        case 0x09:  // register
            set_rule(s, read_uleb(r), OTHER, 0);
            read_uleb(r);
            break;
        case 0x0a:  // remember_state
            if (in->depth == REMEMBERED_MAX)
                return 0;
            in->remembered[in->depth++] = *s;
            break;
        case 0x0b:  // restore_state
            if (!in->depth)
                return 0;
            *s = in->remembered[--in->depth];
            break;
        case 0x0c:  // def_cfa
            s->cfa_register = read_uleb(r);
            s->cfa_offset = (int64_t)read_uleb(r);
            s->cfa_by_expression = 0;
            break;
        case 0x0d:  // def_cfa_register
            s->cfa_register = read_uleb(r);
            break;
        case 0x0e:  // def_cfa_offset
            s->cfa_offset = (int64_t)read_uleb(r);
            break;
        case 0x0f:  // def_cfa_expression
            s->cfa_by_expression = 1;
            skip_block(r);
            break;
        case 0x10:  // expression
        case 0x16:  // val_expression
            set_rule(s, read_uleb(r), OTHER, 0);
            skip_block(r);
            break;
        case 0x11:  // offset_extended_sf
            reg = read_uleb(r);
            set_rule(s, reg, AT_OFFSET, read_sleb(r) * cie->data_align);
            break;
        case 0x12:  // def_cfa_sf
            s->cfa_register = read_uleb(r);
            s->cfa_offset = read_sleb(r) * cie->data_align;
            s->cfa_by_expression = 0;
            break;
        case 0x13:  // def_cfa_offset_sf
            s->cfa_offset = read_sleb(r) * cie->data_align;
            break;
        case 0x14:  // val_offset
            set_rule(s, read_uleb(r), OTHER, 0);
            read_uleb(r);
            break;
        case 0x15:  // val_offset_sf
            set_rule(s, read_uleb(r), OTHER, 0);
            read_sleb(r);
            break;
        case 0x2e:  // GNU_args_size
            read_uleb(r);
            break;
        case 0x2f:  // GNU_negative_offset_extended
            reg = read_uleb(r);
            set_rule(s, reg, AT_OFFSET, -(int64_t)read_uleb(r) * cie->data_align);
            break;
        default:
            return 0;
        }
    }
    return !r->bad;
}

// The interpreter's state as a row of the walk (unwind/tables.py's _rule, from the same facts).
static void to_row(const struct frame_state *s, int signal_frame, struct unwind_row *row)
{
    *row = (struct unwind_row){.cfa_rule = CFA_UNKNOWN, .rbp_rule = RBP_SAME};
    if (signal_frame) {
        row->cfa_rule = CFA_SIGNAL;
        return;
    }
    if (s->ra.how == UNDEFINED) {
        row->cfa_rule = CFA_END;
        return;
    }
    if (s->cfa_by_expression || (s->cfa_register != DWARF_RSP && s->cfa_register != DWARF_RBP) || s->cfa_offset < 0 ||
        s->cfa_offset >= (int64_t)1 << 31)
        return;
    if (!(s->ra.how == SAME || (s->ra.how == AT_OFFSET && s->ra.offset == -8)))
        return;  // SAME: the CIE never named the return address: at CFA-8, as on every x86-64 frame
    if (s->rbp.how == OTHER || (s->rbp.how == AT_OFFSET && (s->rbp.offset < -32768 || s->rbp.offset > 32767)))
        return;
    row->cfa_rule = s->cfa_register == DWARF_RSP ? CFA_RSP : CFA_RBP;
    row->cfa_offset = (s32)s->cfa_offset;
    if (s->rbp.how == AT_OFFSET) {
        row->rbp_rule = RBP_SAVED;
        row->rbp_offset = (s16)s->rbp.offset;
    }
}

static const uint8_t *scanned_fde(uintptr_t pc, uintptr_t *data_base);

// The FDE whose range holds pc, by binary search of .eh_frame_hdr's table.
static const uint8_t *find_fde(uintptr_t pc, uintptr_t *data_base)
{
    const uint8_t *header = eh_frame_header(pc);
    if (!header)
        return scanned_fde(pc, data_base);
    *data_base = (uintptr_t)header;
    if (header[0] != 1 || header[3] != 0x3b)  // version 1; table of datarel sdata4 pairs
        return NULL;
    struct reader r = {header + 4, header + 4 + 16, &own_memory, 0};
    read_encoded(&r, header[1], (uintptr_t)header);  // .eh_frame's address: not needed
    uintptr_t count = read_encoded(&r, header[2], (uintptr_t)header);
    if (r.bad || !count)
        return NULL;
    const int32_t *table = (const int32_t *)r.at;  // (initial location, FDE), from the header
    size_t low = 0, high = count;
    while (high - low > 1) {
        size_t middle = low + (high - low) / 2;
        if ((uintptr_t)header + table[2 * middle] <= pc)
            low = middle;
        else
            high = middle;
    }
    if ((uintptr_t)header + table[2 * low] > pc)
        return NULL;
    return header + table[2 * low + 1];
}

struct fde {
    uintptr_t start, range;
    struct cie cie;
    struct reader instructions;
};

// The FDE at entry (the length read by enter_entry) and its CIE; 0 if either is malformed.
static int read_fde(struct reader *r, uintptr_t data_base, struct fde *fde)
{
    const uint8_t *id_field = r->at;
    uint32_t cie_pointer = (uint32_t)read_fixed(r, 4);
    if (!cie_pointer || r->bad || cie_pointer > (uintptr_t)id_field - (uintptr_t)r->image->start ||
        !read_cie(id_field - cie_pointer, r->image, &fde->cie))
        return 0;
    fde->start = read_encoded(r, fde->cie.fde_encoding, data_base);
    fde->range = read_encoded(r, fde->cie.fde_encoding & 0x0f, 0);
    if (fde->cie.has_augmentation_data)
        skip_block(r);
    fde->instructions = *r;
    return !r->bad;
}

#ifdef __GLIBC__
static const uint8_t *scanned_fde(uintptr_t pc, uintptr_t *data_base)
{
    (void)pc, (void)data_base;
    return NULL;  // glibc's loader always has the header (ld links one for it)
}
#else
// The FDE whose range holds pc, entry by entry through a module's .eh_frame (no header to search).
static const uint8_t *scanned_fde(uintptr_t pc, uintptr_t *data_base)
{
    struct eh_frame_section section;
    if (!eh_frame_section(pc, &section))
        return NULL;
    const struct image image = {section.start, section.start + section.size, 0, 1};
    *data_base = 0;  // no header: nothing is datarel
    struct reader r;
    for (const uint8_t *entry = section.start; enter_entry(&r, entry, &image); entry = r.end) {
        const uint8_t *next = r.end;
        struct reader peek = r;
        struct fde fde;
        if (read_fixed(&peek, 4) != 0 && read_fde(&r, 0, &fde) && pc >= fde.start && pc - fde.start < fde.range)
            return entry;
        r.end = next;
    }
    return NULL;
}
#endif

// Runs the CIE's initial instructions, then the FDE's, up to in->target; 0 on a malformed program.
static int interpret(const struct fde *fde, struct interpreter *in, uintptr_t data_base)
{
    in->location = fde->start;
    in->cie = &fde->cie;
    in->depth = 0;
    in->state = (struct frame_state){.ra.how = SAME};  // SAME: not yet named by the CIE
    struct reader initial = fde->cie.instructions, own = fde->instructions;
    void (*emit)(struct interpreter *) = in->emit;
    in->emit = NULL;  // the CIE's instructions make no row of their own
    int whole = run(in, &initial, data_base);
    in->emit = emit;
    in->initial = in->state;
    in->depth = 0;
    return whole && run(in, &own, data_base);
}

int cfi_rule_at(uintptr_t pc, struct unwind_row *rule)
{
    uintptr_t data_base;
    const uint8_t *entry = find_fde(pc, &data_base);
    struct reader r;
    struct fde fde;
    if (!entry || !enter_entry(&r, entry, &own_memory) || !read_fde(&r, data_base, &fde) || pc < fde.start ||
        pc - fde.start >= fde.range)
        return 0;
    struct interpreter in = {.target = pc};
    if (!interpret(&fde, &in, data_base)) {
        *rule = (struct unwind_row){.cfa_rule = CFA_UNKNOWN};
        return 1;
    }
    to_row(&in.state, fde.cie.signal_frame, rule);
    return 1;
}

struct section_rows {
    struct cfi_section_row *out;
    size_t count, max;
    const struct fde *fde;
};

static void emit_section_row(struct interpreter *in)
{
    struct section_rows *rows = in->emit_to;
    struct unwind_row rule;
    to_row(&in->state, rows->fde->cie.signal_frame, &rule);
    if (rows->count < rows->max)
        rows->out[rows->count] = (struct cfi_section_row){
            .fde_start = rows->fde->start,
            .fde_end = rows->fde->start + rows->fde->range,
            .pc = in->location,
            .cfa_offset = rule.cfa_offset,
            .rbp_offset = rule.rbp_offset,
            .cfa_rule = rule.cfa_rule,
            .rbp_rule = rule.rbp_rule,
        };
    rows->count++;
}

long cfi_section_rows(const uint8_t *section, size_t size, uint64_t address, struct cfi_section_row *out, size_t max)
{
    const struct image image = {section, section + size, (uintptr_t)address - (uintptr_t)section, 0};
    struct section_rows rows = {out, 0, max, NULL};
    struct reader r;
    for (const uint8_t *entry = section; enter_entry(&r, entry, &image); entry = r.end) {
        const uint8_t *next = r.end;
        struct reader peek = r;
        struct fde fde;
        if (read_fixed(&peek, 4) != 0 && read_fde(&r, (uintptr_t)address, &fde)) {  // id 0: a CIE
            struct interpreter in = {.target = UINTPTR_MAX, .emit = emit_section_row, .emit_to = &rows};
            rows.fde = &fde;
            if (!interpret(&fde, &in, (uintptr_t)address))
                in.state.cfa_by_expression = 1;  // from where the program went wrong: no rule
            emit_section_row(&in);
        }
        r.end = next;
    }
    return rows.count > max ? -1 : (long)rows.count;
}
