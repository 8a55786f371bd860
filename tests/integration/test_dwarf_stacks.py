"""Stacks of code built without frame pointers: the BPF engine walks them from each module's
.eh_frame and must give, per call site, the frames the preload engine's unwinder (libgcc)
gives, out to _start or clone3; no frame may point outside an executable mapping."""

from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from each import each

from conftest import PROGRAMS, leaktrace_command
from helpers import AttachedTrace, final_report, reports, run_command, wait_for_line

NO_FP = ["-O2", "-g", "-fomit-frame-pointer"]
SIZES = {
    1002: "depth 2",
    1004: "depth 4",
    1008: "depth 8",
    1012: "depth 12",
    1024: "depth 24",
    3000: "thread",
    4000: "library linked at start",
    1234: "dlopen'ed library's constructor",
    2345: "dlopen'ed library",
    5000: "signal handler",
}


@pytest.fixture(scope="module")
def unwind_programs(build_dir) -> dict[str, Path]:
    """tests/integration/programs/unwind.c and its libraries, and cxx_alloc.cpp, built -O2 without frame
    pointers; unwind.c also with them (the control)."""
    out = build_dir / "unwind"
    out.mkdir(exist_ok=True)
    built = {
        "plugin": out / "libplugin.so",
        "linked": out / "libunwind_linked.so",
        "unwind": out / "unwind",
        "unwind_fp": out / "unwind_fp",
        "cxx": out / "cxx_alloc",
        "uses_plugin": out / "uses_plugin",
        "walk_paths": out / "walk_paths",
    }
    steps = [
        ["gcc", *NO_FP, "-shared", "-fPIC", "-o", built["plugin"], PROGRAMS / "plugin.c"],
        ["gcc", *NO_FP, "-shared", "-fPIC", "-o", built["linked"], PROGRAMS / "unwind_linked.c"],
        ["g++", *NO_FP, "-o", built["cxx"], PROGRAMS / "cxx_alloc.cpp"],
        ["gcc", *NO_FP, "-o", built["uses_plugin"], PROGRAMS / "uses_plugin.c", "-ldl"],
        ["gcc", *NO_FP, "-pthread", "-o", built["walk_paths"], PROGRAMS / "walk_paths.c"],
    ]
    for name, flags in (("unwind", NO_FP), ("unwind_fp", ["-O2", "-g", "-fno-omit-frame-pointer"])):
        steps.append(
            [
                "gcc",
                *flags,
                "-pthread",
                "-o",
                built[name],
                PROGRAMS / "unwind.c",
                f"-L{out}",
                "-lunwind_linked",
                f"-Wl,-rpath,{out}",
                "-ldl",
            ]
        )
    for step in steps:
        subprocess.run([str(part) for part in step], check=True)
    return built


def frame_key(frame: dict) -> tuple:
    """A frame as the same in any run: module, and function+offset or the module offset."""
    return os.path.basename(frame["module"] or "?"), frame["function"], frame["offset"]


def stacks_by_size(report: dict, sizes) -> dict[int, list[tuple]]:
    found = {}
    for group in report["groups"]:
        if group["size"] in sizes:
            assert group["count"] == 1 and group["stack_status"] == "captured", group
            found[group["size"]] = [frame_key(f) for f in group["frames"]]
    return found


def both_engines(command: str, *args: str) -> tuple[dict, dict]:
    """The last JSON report of each engine (args may end with the interval and count)."""
    args = args if args and args[-1].isdigit() else (*args, "3600")
    bpf = final_report(run_command(["-c", command, "--json", "--frames", "40", *args]))
    preload = final_report(run_command(["-c", command, "--json", "--frames", "40", "--engine", "preload", *args]))
    return bpf, preload


def assert_every_frame_in_an_executable_file(report: dict, sizes) -> None:
    """Every native frame is in a module file (a Python function's frame is in its script)."""
    for group in report["groups"]:
        if group["size"] in sizes:
            for frame in group["frames"]:
                assert frame["kind"] == "python" or frame["module"] and frame["module"].startswith("/"), frame


@pytest.mark.parametrize("build", ["unwind", "unwind_fp"])
def test_frames_equal_the_preload_engines_out_to_start(unwind_programs, build):
    command = f"{unwind_programs[build]} {unwind_programs['plugin']}"
    bpf, preload = both_engines(command)
    from_bpf, from_preload = stacks_by_size(bpf, SIZES), stacks_by_size(preload, SIZES)
    assert sorted(from_bpf) == sorted(SIZES)
    for size, what in SIZES.items():
        assert from_bpf[size] == from_preload[size], what
    for depth in (2, 4, 8, 12, 24):
        stack = from_bpf[1000 + depth]
        assert [f[1] for f in stack[:depth]] == ["descend"] * depth and stack[depth][1] == "main"
    assert from_bpf[1024][-1][1] == "_start" and from_bpf[3000][0][1] == "thread_body"
    assert "on_signal" == from_bpf[5000][0][1] and "main" in [f[1] for f in from_bpf[5000]]
    assert_every_frame_in_an_executable_file(bpf, SIZES)
    assert bpf["counters"]["stacks_truncated"] == 0


def test_cxx_allocations_in_templates(unwind_programs):
    sizes = {3108, 2000, 601}  # the vector of 777 ints, the array, the string
    bpf, preload = both_engines(str(unwind_programs["cxx"]), "--min-size", "600")
    from_bpf = stacks_by_size(bpf, sizes)
    assert sorted(from_bpf) == sorted(sizes)
    assert from_bpf == stacks_by_size(preload, sizes)
    assert all(stack[-1][1] == "_start" for stack in each(from_bpf.values()))
    assert_every_frame_in_an_executable_file(bpf, sizes)


def test_python_bytearrays_are_walked_through_the_interpreter():
    # A report while it sleeps: at exit the interpreter frees them.
    command = "/usr/bin/python3 -c 'import time; b=[bytearray(50000 + i) for i in range(3)]; time.sleep(4)'"
    sizes = {50001, 50002}  # bytearray(50000 + i) asks for one byte more
    bpf, preload = both_engines(command, "--min-size", "50000", "--max-size", "50010", "2", "1")
    from_bpf = stacks_by_size(bpf, sizes)
    assert from_bpf == stacks_by_size(preload, sizes)
    for stack in from_bpf.values():
        assert stack[-1][1] == "_start" and any(f[1] == "Py_BytesMain" for f in stack)
    assert_every_frame_in_an_executable_file(bpf, sizes)
    for report in (bpf, preload):  # the list comprehension's frame, then the module's, where the interpreter's were
        for group in report["groups"]:
            if group["size"] in sizes:
                python = [(f["function"], f["file"], f["line"]) for f in group["frames"] if f["kind"] == "python"]
                assert python == [("<listcomp>", "<string>", 1), ("<module>", "<string>", 1)], group["frames"]


def every_stack(report: dict) -> list[tuple]:
    """(size, count, frames) of every group, in a stable order."""
    return sorted((g["size"], g["count"], tuple(frame_key(f) for f in g["frames"])) for g in report["groups"])


@pytest.mark.parametrize(
    "command",
    [
        "{unwind} {plugin}",
        "{unwind_fp} {plugin}",
        "{cxx}",
        "{uses_plugin} {plugin}",
        "/usr/bin/python3 -c 'b=[bytearray(50000 + i) for i in range(3)]; import json'",
        "{walk_paths} {seed}",
    ],
)
def test_preload_rules_walk_gives_libgcc_frames(unwind_programs, command):
    """The preload library's own walk (CFI rules, cached, steps shared with the thread's last
    walk copied) and libgcc's _Unwind_Backtrace give the same frames for every allocation of
    the program, at its exit."""
    seed = random.randrange(1, 1 << 32)
    print(f"seed {seed}")
    command = command.format(seed=seed, **{name: str(path) for name, path in unwind_programs.items()})
    preload = ["-c", command, "--json", "--frames", "40", "--engine", "preload", "3600"]
    environment = {**os.environ, "PYTHONHASHSEED": "0"}
    by_rules = final_report(run_command(preload, env=environment))
    by_libgcc = final_report(run_command(preload, env={**environment, "LEAKTRACE_UNWINDER": "libgcc"}))
    assert every_stack(by_rules) == every_stack(by_libgcc)
    assert len(every_stack(by_rules)) >= 3


def test_frame_pointer_walk_ends_where_it_cannot_go_on_and_says_so(unwind_programs):
    """--unwind fp on code without frame pointers: short stacks, counted, never garbage."""
    command = f"{unwind_programs['unwind']} {unwind_programs['plugin']}"
    report = final_report(run_command(["-c", command, "--json", "--unwind", "fp", "3600"]))
    assert report["counters"]["stacks_truncated"] > 0
    assert report["counters"]["stacks_truncated_no_rule"] > 0  # the chain, with no rows to go by
    assert_every_frame_in_an_executable_file(report, SIZES)
    assert stacks_by_size(report, {1024})[1024][0][1] == "descend"


def test_a_library_deleted_since_it_was_loaded_is_read_as_mapped(unwind_programs, tmp_path):
    """After an upgrade a service maps libraries whose files are gone ("(deleted)" in its maps):
    the very file it maps is read (through /proc/PID/map_files), for symbols and for the walk."""
    library = tmp_path / "libplugin.so"
    shutil.copy(unwind_programs["plugin"], library)
    target = subprocess.Popen(
        [str(unwind_programs["uses_plugin"]), str(library), "wait"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for_line(target.stdout) == "ready\n"
        library.unlink()
        trace = AttachedTrace(target.pid, "--frames", "40", "0.3")
        target.stdin.write("leak\n")
        target.stdin.flush()
        assert wait_for_line(target.stdout) == "done\n"
        time.sleep(0.8)
        _, out, err = trace.stop()
    finally:
        target.kill()
        target.wait()
    assert "Traceback" not in err
    [stack] = stacks_by_size(reports(out)[-1], {2345}).values()
    assert stack[0] == ("libplugin.so (deleted)", "plugin_leak", stack[0][2])
    assert stack[1][:2] == ("uses_plugin", "main") and stack[2][0] == "libc.so.6" and stack[-1][1] == "_start"


def test_tables_kept_across_starts_give_the_same_stacks(unwind_programs, tmp_path):
    """Compiled tables are cached by the digest of the sections they come from: a second start
    reads them back, a damaged file is compiled again, and a directory others may write is
    not used (tables steer the walk)."""
    from leaktrace.platform.elf import ElfFile
    from leaktrace.unwind.tables import CACHE_FORMAT, cfi_digest

    cache = tmp_path / "cache"
    command = f"{unwind_programs['unwind']} {unwind_programs['plugin']}"

    def stacks() -> dict:
        result = run_command(
            ["-c", command, "--json", "--frames", "40", "3600"], env=dict(os.environ, LEAKTRACE_CACHE_DIR=str(cache))
        )
        return stacks_by_size(final_report(result), SIZES)

    first = stacks()
    program_file = cache / f"{cfi_digest(ElfFile(str(unwind_programs['unwind'])))}.v{CACHE_FORMAT}"
    libc_file = cache / f"{cfi_digest(ElfFile('/lib/x86_64-linux-gnu/libc.so.6'))}.v{CACHE_FORMAT}"
    assert program_file.exists() and libc_file.exists() and cache.stat().st_mode & 0o777 == 0o700
    program_file.write_bytes(program_file.read_bytes()[:100])  # damaged: compiled again
    assert stacks() == first and program_file.stat().st_size > 100
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    result = run_command(
        ["-c", command, "--json", "--frames", "40", "3600"], env=dict(os.environ, LEAKTRACE_CACHE_DIR=str(shared))
    )
    assert stacks_by_size(final_report(result), SIZES) == first and not list(shared.iterdir())
    assert f"unwind table cache not used: {shared}: others can write to it" in result.stderr


def test_a_forged_build_id_does_not_poison_the_table_cache(unwind_programs, tmp_path):
    """A target chooses its build-id: a program built with libc's, traced first, must not give
    every later trace libc's frames from its own table (the cache is keyed on the CFI's bytes)."""
    from leaktrace.platform.elf import ElfFile

    libc_id = ElfFile("/lib/x86_64-linux-gnu/libc.so.6").build_id
    forged = tmp_path / "forged"
    subprocess.run(
        ["gcc", *NO_FP, f"-Wl,--build-id=0x{libc_id}", "-o", forged, PROGRAMS / "uses_plugin.c", "-ldl"], check=True
    )
    assert ElfFile(str(forged)).build_id == libc_id
    env = dict(os.environ, LEAKTRACE_CACHE_DIR=str(tmp_path / "cache"))
    command = f"{unwind_programs['unwind']} {unwind_programs['plugin']}"
    uncached = stacks_by_size(final_report(run_command(["-c", command, "--json", "--frames", "40", "3600"])), SIZES)
    final_report(run_command(["-c", f"{forged} {unwind_programs['plugin']}", "--json", "3600"], env=env))
    after = final_report(run_command(["-c", command, "--json", "--frames", "40", "3600"], env=env))
    assert after["counters"]["stacks_truncated"] == 0
    assert stacks_by_size(after, SIZES) == uncached


def forge_fde_ranges(library: Path, count: int, pc_range: int) -> int:
    """Writes pc_range into the first count FDEs of library's .eh_frame (pc_begin and pc_range
    as 4-byte fields, gcc's encoding): a module as a hostile user may build. Returns how many."""
    from leaktrace.platform.elf import ElfFile

    elf = ElfFile(str(library))
    [(offset, size)] = [(section[2], section[3]) for section in elf._sections if section[0] == ".eh_frame"]
    data = bytearray(library.read_bytes())
    at, forged = offset, 0
    while at < offset + size and forged < count:
        length, cie_id = struct.unpack_from("<II", data, at)
        if length == 0:
            break
        if cie_id != 0:  # an FDE: pc_begin at +8, pc_range at +12
            struct.pack_into("<I", data, at + 12, pc_range)
            forged += 1
        at += 4 + length
    library.write_bytes(bytes(data))
    return forged


def test_a_module_whose_fdes_claim_two_gib_costs_no_more_than_its_code(unwind_programs, tmp_path):
    """Three FDEs patched to cover 0x7fffffff bytes (a hostile module): they are cut to the
    module's own code, leaktrace says so, its memory stays bounded, and stacks stay whole."""
    hostile = tmp_path / "libplugin.so"
    shutil.copy(unwind_programs["plugin"], hostile)
    assert forge_fde_ranges(hostile, 3, 0x7FFFFFFF) == 3
    measure = "import resource, subprocess, sys; subprocess.run(sys.argv[1:]); "
    measure += "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)"
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            measure,
            *leaktrace_command("-c", f"{unwind_programs['uses_plugin']} {hostile}", "--json", "3600"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in result.stderr, result.stderr
    assert f"{hostile}: 3 FDEs reach outside its code: cut to it" in result.stderr
    peak_kib = int(result.stderr.splitlines()[-1])
    assert peak_kib < 400 * 1024, f"leaktrace peaked at {peak_kib} KiB"
    from leaktrace.platform.elf import ElfFile
    from leaktrace.unwind.rows import ROW_PAGE_SHIFT
    from leaktrace.unwind.tables import UnwindTables, code_ranges

    elf = ElfFile(str(hostile))
    code_bytes = sum(end - start for start, end in code_ranges(elf))
    table = UnwindTables().table_of(elf)  # 4 million pages before, for 2 GiB claimed
    assert table.refused == 3 and table.page_count <= (code_bytes >> ROW_PAGE_SHIFT) + 2
    report = reports(result.stdout)[-1]
    assert report["counters"]["stacks_truncated"] == 0
    [stack] = stacks_by_size(report, {2345}).values()
    assert stack[0][1] == "plugin_leak" and stack[-1][1] == "_start"


def test_frames_of_a_library_unloaded_since_keep_their_names(unwind_programs):
    """A library dlclose'd after it allocated: the report at exit (its code unmapped by then)
    still names its frames, from the mappings the process had."""
    report = final_report(
        run_command(
            [
                "-c",
                f"{unwind_programs['uses_plugin']} {unwind_programs['plugin']} close",
                "--json",
                "--frames",
                "40",
                "3600",
            ]
        )
    )
    stacks = stacks_by_size(report, {1234, 2345})
    assert stacks[2345][0][:2] == ("libplugin.so", "plugin_leak") and stacks[2345][1][:2] == ("uses_plugin", "main")
    assert stacks[1234][0][:2] == ("libplugin.so", "plugin_init")
    assert report["counters"]["stacks_truncated"] == 0


def test_a_program_with_more_modules_than_the_walk_knows_keeps_the_first_ones_whole(tmp_path):
    """600 modules dlopen'ed one after another (604 executable mappings, the walk knows 512):
    every module's allocation is counted; those of the program and the modules mapped first
    reach main, the rest end early, counted and said once."""
    count = 600
    (tmp_path / "m.c").write_text(
        "#include <stdlib.h>\nvoid *volatile kept;\nvoid touch(void) { kept = malloc(16); }\n"
    )
    subprocess.run(["gcc", *NO_FP, "-shared", "-fPIC", "-o", tmp_path / "m.so", tmp_path / "m.c"], check=True)
    loader = tmp_path / "many_modules"
    subprocess.run(["gcc", *NO_FP, "-o", loader, PROGRAMS / "many_modules.c", "-ldl"], check=True)
    for i in range(count):
        shutil.copy(tmp_path / "m.so", tmp_path / f"m{i}.so")
    result = run_command(["-c", f"{loader} {tmp_path} {count}", "--json", "--frames", "40", "3600"])
    report = final_report(result)
    touched = [g for g in report["groups"] if g["size"] == 16 and g["frames"][0]["function"] == "touch"]
    assert sum(g["count"] for g in touched) == count
    whole = [g for g in touched if "main" in [f["function"] for f in g["frames"]]]
    assert count - 100 < len(whole) < count
    modules = {int(g["frames"][0]["module"].rsplit("/m", 1)[1].split(".")[0]) for g in whole}
    assert modules == set(range(len(whole))), "the modules loaded first are the ones kept"
    assert report["counters"]["stacks_truncated"] >= count - len(whole)
    assert report["counters"]["stacks_truncated_unknown_code"] == report["counters"]["stacks_truncated"]
    assert result.stderr.count("executable ranges, more than the stack walk's 512") == 1


@pytest.fixture(scope="module")
def big_text(build_dir) -> Path:
    """programs/big_text.c with 200 MiB of code, built as chromium is (frame pointers, no unwind
    tables) around one function with CFI and no frame pointer (big_text_cfi.c)."""
    out = build_dir / "big_text"
    out.mkdir(exist_ok=True)
    chromium_like = ["-O1", "-fno-omit-frame-pointer", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"]
    steps = [
        ["gcc", *chromium_like, "-fno-optimize-sibling-calls", '-DBIG_TEXT_MIB="200"', "-c", "-o", out / "main.o"],
        ["gcc", *NO_FP, "-c", "-o", out / "cfi.o", PROGRAMS / "big_text_cfi.c"],
        ["gcc", "-pthread", "-o", out / "big_text", out / "main.o", out / "cfi.o"],
    ]
    steps[0].append(PROGRAMS / "big_text.c")
    for step in steps:
        subprocess.run([str(part) for part in step], check=True)
    return out / "big_text"


def test_stacks_through_frame_pointer_code_larger_than_the_page_index_reach_main(big_text):
    """Code without CFI is walked by its frame pointers, on into libc's CFI where a caller keeps
    none (main's and the thread's callers), in a module of 200 MiB: whole stacks, none truncated."""
    result = run_command(["-c", str(big_text), "--json", "--frames", "40", "3600"])
    report = final_report(result)
    assert report["counters"]["stacks_truncated"] == 0, report["counters"]
    assert "do not fit" not in result.stderr and "does not fit" not in result.stderr
    found = {
        group["size"]: [frame["function"] for frame in group["frames"]]
        for group in report["groups"]
        if group["size"] in (7001, 7002, 7003)
    }
    start = ["main", "__libc_start_call_main", "__libc_start_main", "_start"]
    assert found == {
        7001: start,
        7002: ["allocate_here", "through_cfi", *start],
        7003: ["allocate_here", "thread_body", "start_thread", "clone3"],
    }
