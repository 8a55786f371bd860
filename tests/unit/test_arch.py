"""Each architecture's table holds what that architecture's own headers say: its system call
numbers as its kernel headers define them (read through its compiler: gcc for x86-64,
gcc-aarch64-linux-gnu for aarch64), its relocation types and its seccomp architecture as
<elf.h> and <linux/audit.h> define them."""

from __future__ import annotations

import re
import subprocess

import pytest

from leaktrace.platform.arch import TABLES, Arch
from tests.each import each

COMPILERS = {"x86_64": "gcc", "aarch64": "aarch64-linux-gnu-gcc"}
RELOCATIONS = {"x86_64": "R_X86_64", "aarch64": "R_AARCH64"}
AUDIT = {"x86_64": "AUDIT_ARCH_X86_64", "aarch64": "AUDIT_ARCH_AARCH64"}


def _expanded(compiler: str, includes: list[str], expressions: dict[str, str]) -> dict[str, str]:
    """Each expression as the compiler's preprocessor leaves it, for the machine it builds for."""
    source = "".join(f"#include <{header}>\n" for header in includes)
    source += "".join(f"leaktrace_{name} = {expression};\n" for name, expression in expressions.items())
    out = subprocess.run(
        [compiler, "-E", "-P", "-x", "c", "-"], input=source, capture_output=True, text=True, check=True
    )
    found = dict(re.findall(r"^leaktrace_(\w+) = (.*);$", out.stdout, re.M))
    assert set(found) == set(expressions)
    return found


def _number(expression: str) -> int:
    """A constant expression of integers, parentheses and |, as the kernel's headers write them."""
    assert re.fullmatch(r"[\s()|0-9a-fA-FxXuUlL]+", expression), expression
    return eval(re.sub(r"(?<=[0-9a-fA-F])[uUlL]+", "", expression))  # noqa: S307 (digits, | and parentheses only)


@pytest.mark.parametrize("table", TABLES.values(), ids=lambda table: table.machine)
def test_system_call_numbers_are_the_kernels(table: Arch):
    names = {name: f"__NR_{name}" for name in table.syscalls}
    found = _expanded(COMPILERS[table.machine], ["asm/unistd.h"], names)
    assert each({name: _number(found[name]) for name in names}.items()) == list(table.syscalls.items())


@pytest.mark.parametrize("table", TABLES.values(), ids=lambda table: table.machine)
def test_relocations_and_the_seccomp_architecture_are_the_headers(table: Arch):
    prefix = RELOCATIONS[table.machine]
    expressions = {"jump_slot": f"{prefix}_JUMP_SLOT", "glob_dat": f"{prefix}_GLOB_DAT", "audit": AUDIT[table.machine]}
    found = {name: _number(value) for name, value in _expanded("gcc", ["elf.h", "linux/audit.h"], expressions).items()}
    assert found == {"jump_slot": table.jump_slot, "glob_dat": table.glob_dat, "audit": table.audit_arch}


@pytest.mark.parametrize("table", TABLES.values(), ids=lambda table: table.machine)
def test_the_waits_and_the_argument_registers_are_named_in_the_table(table: Arch):
    assert set(table.eintr_waits) <= set(table.waiting_calls) <= set(table.syscalls)
    assert len(table.argument_registers) == 3
    assert "restart_syscall" in table.syscalls and {"nanosleep", "clock_nanosleep", "futex"} <= set(table.waiting_calls)
