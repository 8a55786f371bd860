"""Every fact of x86-64 (Linux, System V ABI) that leaktrace relies on, in one place."""

NAME = "x86_64"  # as libmemunreachable's report names the ABI
SYS_BPF = 321  # the bpf() system call's number
SYS_READ, SYS_RT_SIGACTION = 0, 13
# struct user_regs_struct (PTRACE_GETREGS): 27 words; rsp is the 20th, fs_base (the thread pointer) the 22nd.
USER_REGS_WORDS, RSP_INDEX, FS_BASE_INDEX = 27, 19, 21
RAX_INDEX, ORIG_RAX_INDEX, RIP_INDEX = 10, 15, 16
SYSCALL_BYTES = 2  # the syscall instruction: rip - 2 runs it again
# Waits the kernel ends with EINTR, never restarting them, when a ptrace interrupt wakes them:
# rt_sigtimedwait, epoll_wait, epoll_pwait, epoll_pwait2.
EINTR_WAITS = frozenset({128, 232, 281, 441})
RED_ZONE = 128  # bytes below the stack pointer that are still the running function's
SIZE_MAX = 2**64 - 1  # size_t's largest value
# The allocator's arguments, in order: rdi, rsi, rdx (the probes read them from the registers).
ARGUMENT_REGISTERS = ("rdi", "rsi", "rdx")
