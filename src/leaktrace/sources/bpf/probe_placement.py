"""Where each allocator probe goes: the first instruction the kernel can emulate.

A uprobe costs what the kernel must do to run the instruction under it: x86
emulates push, nop and relative jumps and calls (about a microsecond on this
VM), and single-steps anything else out of line (about 15 us). glibc's free
starts with `test rdi, rdi`, so its probe moves to the `je` behind it; jemalloc's
free runs ten loads and register moves before its first `jne`. A probe moves
only along the straight line from the entry (so every call passes it), over
instructions that leave the stack pointer and the frame pointer as they were,
write no memory and do not branch, and only when no branch inside the function
lands on or before the new spot. An argument may change register on the way
(mimalloc's malloc: `mov rsi, rdi`, then `mov rdi, fs:[rax]`): the placement
says where each one is at the probe, and the probe's cookie tells the BPF program.
"""

from __future__ import annotations

from dataclasses import dataclass

from capstone import CS_ARCH_X86, CS_MODE_64, CS_OP_MEM, Cs, CsError
from capstone import x86_const as x86

from leaktrace.platform.elf import ElfError, ElfFile

# Registers the BPF program reads at every probe: the stack pointer (the return
# address, the call's identity) and the frame pointer (the stack walk).
ALWAYS_KEPT = frozenset(("rsp", "rbp"))
SKIP_AT_MOST = 24  # instructions a probe may move over
EM_X86_64, EM_AARCH64 = 62, 183
LEGACY_PREFIXES = frozenset((0xF0, 0xF2, 0xF3, 0x2E, 0x36, 0x3E, 0x26, 0x64, 0x65))
_BRANCH_GROUPS = (x86.X86_GRP_JUMP, x86.X86_GRP_CALL, x86.X86_GRP_RET, x86.X86_GRP_INT, x86.X86_GRP_IRET)


@dataclass(frozen=True)
class Placement:
    function: str
    entry: int  # link-time address of the function
    address: int  # where the probe goes
    why: str  # one line for --verbose
    instruction: bytes = b""  # the probed instruction, when it could be decoded
    registers: tuple[str, ...] = ()  # where each argument asked for is at the probe (empty: where the ABI put it)
    unprobed: bool = False  # a tail-call wrapper of a probed function: no probe of its own
    machine: int = EM_X86_64  # the ELF machine whose instruction `instruction` is

    @property
    def moved(self) -> int:
        return self.address - self.entry

    @property
    def single_stepped(self) -> bool:
        """The kernel runs the probed instruction out of line (the slow trap), or it is not known."""
        if self.machine == EM_AARCH64:
            return not arm64_kernel_simulates(self.instruction)
        return not kernel_emulates(self.instruction)


# The aarch64 instructions whose uprobe the kernel simulates instead of stepping them out of
# line, as (mask, value) of the instruction word: arch/arm64/kernel/probes/decode-insn.c's b, bl,
# b.cond, cbz/cbnz, tbz/tbnz, br/blr/ret, adr/adrp, and ldr/ldrsw of a literal.
ARM64_SIMULATED = (
    (0x7C000000, 0x14000000),  # b, bl
    (0xFF000010, 0x54000000),  # b.cond
    (0x7E000000, 0x34000000),  # cbz, cbnz
    (0x7E000000, 0x36000000),  # tbz, tbnz
    (0xFF9FFC1F, 0xD61F0000),  # br, blr
    (0xFFFFFC1F, 0xD65F0000),  # ret
    (0x1F000000, 0x10000000),  # adr, adrp
    (0xBF000000, 0x18000000),  # ldr (literal), 32 and 64 bits
    (0xFF000000, 0x98000000),  # ldrsw (literal)
)


def arm64_kernel_simulates(code: bytes) -> bool:
    """True for an aarch64 instruction (4 bytes, little-endian) the kernel simulates at a uprobe."""
    if len(code) != 4:
        return False
    word = int.from_bytes(code, "little")
    return any(word & mask == value for mask, value in ARM64_SIMULATED)


def kernel_emulates(code: bytes) -> bool:
    """True for the x86 instructions whose uprobe the kernel emulates instead of single-stepping.

    Mirrors arch/x86/kernel/uprobes.c: push of a register (optionally REX.B),
    nop, jmp/call rel and jcc rel, without an operand-size (0x66) prefix.
    """
    if len(code) in (1, 2) and 0x50 <= code[-1] <= 0x57 and (len(code) == 1 or code[0] == 0x41):
        return True
    at = 0
    while at < len(code) and code[at] in LEGACY_PREFIXES:
        at += 1
    opcode = code[at:]
    if not opcode or 0x66 in code[:at]:
        return False
    if opcode[0] in (0x90, 0xEB, 0xE9, 0xE8) or 0x70 <= opcode[0] <= 0x7F:
        return True
    return len(opcode) >= 2 and opcode[0] == 0x0F and 0x80 <= opcode[1] <= 0x8F


def _full_register(md: Cs, reg: int) -> str:
    """rdi for edi/di/dil, r8 for r8d/r8w/r8b, and so on."""
    name = md.reg_name(reg) or ""
    families = {
        "di": "rdi",
        "si": "rsi",
        "dx": "rdx",
        "dl": "rdx",
        "dh": "rdx",
        "cx": "rcx",
        "cl": "rcx",
        "ch": "rcx",
        "sp": "rsp",
        "spl": "rsp",
        "bp": "rbp",
        "bpl": "rbp",
        "dil": "rdi",
        "sil": "rsi",
    }
    if name.startswith("r") and name[1:2].isdigit():
        return name.rstrip("dwb")
    if name in ("rdi", "rsi", "rdx", "rcx", "rsp", "rbp"):
        return name
    return families.get(name.removeprefix("e").removeprefix("r"), name)


def _skip(md: Cs, insn, found: dict[str, frozenset[str]]) -> str | dict[str, frozenset[str]]:
    """Where each argument is after insn (argument -> the registers holding it), or why the
    probe cannot move over insn."""
    if any(insn.group(group) for group in _BRANCH_GROUPS):
        return "a branch"
    for op in insn.operands:
        if op.type == CS_OP_MEM and op.access & 2:  # CS_AC_WRITE
            return "it writes memory"
    _, written_regs = insn.regs_access()
    written = {_full_register(md, reg) for reg in written_regs}
    clobbered = sorted(written & ALWAYS_KEPT)
    if clobbered:
        return f"it writes {', '.join(clobbered)}"
    copied_from = None
    if insn.id == x86.X86_INS_MOV and len(insn.operands) == 2 and insn.operands[0].size == 8:
        destination, source = insn.operands
        if destination.type == source.type == x86.X86_OP_REG:
            copied_from = _full_register(md, source.reg)
    moved = {}
    for argument, registers in found.items():
        kept = registers - written
        if copied_from in registers:
            kept |= written  # a full 64-bit copy: the argument is in both
        if not kept:
            return f"it overwrites {argument}"
        moved[argument] = kept
    return moved


def _branch_targets(instructions) -> set[int]:
    targets = set()
    for insn in instructions:
        if insn.group(x86.X86_GRP_JUMP) or insn.group(x86.X86_GRP_CALL):
            for op in insn.operands:
                if op.type == x86.X86_OP_IMM:
                    targets.add(op.imm)
    return targets


def only_tail_calls(elf: ElfFile, entry: int) -> bool:
    """Whether the function at entry calls nothing and leaves only by returning or by a direct
    jump out of itself (a tail call): whatever it allocates, the jump's target does."""
    symbol = elf.function_at(entry)
    if elf.machine != EM_X86_64 or symbol is None or symbol.value != entry or not symbol.size:
        return False  # another machine's code is not read: its function is probed itself
    md = Cs(CS_ARCH_X86, CS_MODE_64)
    md.detail = True
    try:
        instructions = list(md.disasm(elf.read(entry, symbol.size), entry))
    except (CsError, ElfError):
        return False
    if not instructions or instructions[-1].address + instructions[-1].size < entry + symbol.size:
        return False
    leaves = False
    for insn in instructions:
        if insn.group(x86.X86_GRP_CALL):
            return False
        if insn.group(x86.X86_GRP_JUMP):
            if not insn.operands or insn.operands[0].type != x86.X86_OP_IMM:
                return False  # an indirect jump: where it goes is not known
            if not entry <= insn.operands[0].imm < entry + symbol.size:
                if insn.id != x86.X86_INS_JMP:
                    return False  # a conditional tail call
                leaves = True
    return leaves


def place_probe(elf: ElfFile, function: str, entry: int, arguments: tuple[str, ...]) -> Placement:
    """The probe's address for one function, at its entry unless moving it is proven safe.

    arguments: the registers the BPF program reads there (rdi, rsi, ...).
    """

    def at_entry(reason: str, instruction: bytes = b"") -> Placement:
        why = f"{function}: probe at entry ({reason})"
        return Placement(function, entry, entry, why, instruction, machine=elf.machine)

    if elf.machine == EM_AARCH64 and elf.is_64:
        try:  # never moved: its first instruction tells only what the probe costs
            word = elf.read(entry, 4)
        except ElfError as e:
            return at_entry(str(e))
        how = "simulated by the kernel" if arm64_kernel_simulates(word) else "stepped out of line"
        return at_entry(f"aarch64, {word[::-1].hex()} {how}", word)
    if elf.machine != EM_X86_64 or not elf.is_64:
        return at_entry("not x86-64")
    symbol = elf.function_at(entry)
    size = symbol.size if symbol is not None and symbol.value == entry else 0
    try:
        code = elf.read(entry, size or 64)
    except ElfError as e:
        return at_entry(str(e))
    md = Cs(CS_ARCH_X86, CS_MODE_64)
    md.detail = True
    try:
        instructions = list(md.disasm(code, entry))
    except CsError as e:
        return at_entry(f"cannot disassemble: {e}")
    if not instructions:
        return at_entry("cannot disassemble")
    first = instructions[0]
    first_bytes = bytes(first.bytes)
    if kernel_emulates(first_bytes):
        return at_entry(f"{first.mnemonic} {first.op_str} is emulated", first_bytes)
    if not size:
        return at_entry("function size unknown: cannot check branches into it", first_bytes)
    if instructions[-1].address + instructions[-1].size < entry + size:
        return at_entry("cannot disassemble all of it: cannot check branches into it", first_bytes)
    if any(
        insn.group(x86.X86_GRP_JUMP) and insn.operands and insn.operands[0].type != x86.X86_OP_IMM
        for insn in instructions
    ):
        return at_entry("it has an indirect jump", first_bytes)
    targets = _branch_targets(instructions)
    skipped: list[str] = []
    found = {argument: frozenset((argument,)) for argument in arguments}
    for insn in instructions[: SKIP_AT_MOST + 1]:
        if any(entry < target <= insn.address for target in targets):
            return at_entry(f"a branch lands on {insn.mnemonic} at +{insn.address - entry:#x}", first_bytes)
        if kernel_emulates(bytes(insn.bytes)):
            registers = tuple(
                argument if argument in found[argument] else min(found[argument]) for argument in arguments
            )
            moves = [f"{argument} in {where}" for argument, where in zip(arguments, registers) if argument != where]
            return Placement(
                function,
                entry,
                insn.address,
                f"{function}: probe at +{insn.address - entry:#x} on {insn.mnemonic} {insn.op_str} "
                f"(emulated), after {len(skipped)} instructions ({'; '.join(skipped)})"
                + (f"; {', '.join(moves)} there" if moves else ""),
                bytes(insn.bytes),
                registers,
            )
        after = _skip(md, insn, found)
        if isinstance(after, str):
            return at_entry(
                f"{first.mnemonic} {first.op_str} is single-stepped; "
                f"{insn.mnemonic} {insn.op_str} cannot be skipped: {after}",
                first_bytes,
            )
        found = after
        skipped.append(f"{insn.mnemonic} {insn.op_str}")
    return at_entry(
        f"{first.mnemonic} {first.op_str} is single-stepped; no emulated instruction in the first {SKIP_AT_MOST + 1}",
        first_bytes,
    )
