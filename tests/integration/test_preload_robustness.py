"""The preload library where programs get hard: stacks toggled by signal, libraries
loaded by ld.so and by dlopen, signals arriving inside the allocator from every side,
a table left without memory, and backtrace_full's symbolized dump lines."""

from __future__ import annotations

import os
import re
import subprocess
from collections import Counter

from leaktrace import Symbolizer
from leaktrace.android.heap_dump import read_heap_dump, render_heap_dump
from leaktrace.model.snapshot import Credentials

from conftest import PROGRAMS
from helpers import final_report, library_env, run_command, run_with_library, sites


def exit_dump_records(path) -> list[tuple[int, int, int]]:
    """(size, count, frames) of each record of a v1.2 dump."""
    records = []
    for line in path.read_text().splitlines():
        found = re.match(r"z \d  sz +(\d+)  num +(\d+)  bt((?: [0-9a-f]+)*)$", line)
        if found:
            records.append((int(found.group(1)), int(found.group(2)), len(found.group(3).split())))
    return records


def test_stacks_switched_on_and_off_by_signal(program, tmp_path):
    """111 and 333 are allocated with stacks off, 222 with them on: leak info holds 222 only,
    the dump holds all three, two of them without frames (bionic's hash index 0)."""
    result = run_with_library(
        [str(program("stack_toggle"))],
        f"backtrace_enable_on_signal=8 backtrace_dump_on_exit backtrace_dump_prefix={tmp_path}/d",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["entry 222 1 stack", "total 222 depth 8"]
    records = {size: frames for size, _, frames in exit_dump_records(next(tmp_path.glob("d.*.exit.txt")))}
    assert records[111] == records[333] == 0 and 2 <= records[222] <= 8
    # With backtrace as well, stacks start on and the first signal turns them off.
    result = run_with_library([str(program("stack_toggle"))], "backtrace backtrace_enable_on_signal")
    assert result.stdout.splitlines() == ["entry 333 1 stack", "entry 111 1 stack", "total 444 depth 16"]


def plugin(build_dir) -> str:
    path = build_dir / "libplugin.so"
    if not path.exists():
        subprocess.run(["gcc", "-shared", "-fPIC", "-g", "-O0", "-o", str(path), f"{PROGRAMS}/plugin.c"], check=True)
    return str(path)


def test_libraries_loaded_by_ld_so_and_by_dlopen(program, build_dir):
    """A constructor's block (run by ld.so before main, or inside dlopen) and a plugin
    function's block: the same call sites under both engines, symbolized in the library."""
    library = plugin(build_dir)
    linked = build_dir / "uses_plugin_linked"
    subprocess.run(
        [
            "gcc",
            "-g",
            "-O0",
            "-DLINKED",
            "-o",
            str(linked),
            f"{PROGRAMS}/uses_plugin.c",
            library,
            f"-Wl,-rpath,{build_dir}",
        ],
        check=True,
    )
    for command in (str(linked), f"{program('uses_plugin')} {library}"):
        for engine in ("bpf", "preload"):
            report = final_report(run_command(["-c", command, "--engine", engine, "--json", "3600"]))
            found = sites(report)
            assert found["plugin_init"] == [(1234, 1)] and found["plugin_leak"] == [(2345, 1)], (engine, found)
            modules = {group["frames"][0]["module"] for group in report["groups"] if group["size"] in (1234, 2345)}
            assert modules == {library}, (engine, modules)


def test_signals_inside_the_allocator(program, tmp_path):
    """Four threads allocate while dump and toggle signals rain on them: no deadlock, and
    the exit dump holds exactly the 4000 blocks they kept (some with stacks, some without)."""
    result = run_with_library(
        [str(program("signal_storm"))],
        f"backtrace backtrace_enable_on_signal backtrace_dump_on_exit backtrace_dump_prefix={tmp_path}/d",
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[1]) > 100  # signals sent
    (dump,) = tmp_path.glob("d.*.exit.txt")
    kept = Counter()
    for size, count, _ in exit_dump_records(dump):
        if 1001 <= size <= 1127 and size % 2:
            kept[size] += count
    # Each thread keeps i = 0, 100, ... 99900: size index (i / 100) % 64 is below 40 sixteen times.
    assert kept == {1001 + 2 * k: 64 if k < 40 else 60 for k in range(64)}
    assert "could not record" not in result.stderr


def test_a_table_without_memory_says_what_it_could_not_record(program):
    """The address space capped under the program: the library's table cannot grow, so blocks
    go unrecorded. Each one is counted (live_map_full, as the BPF engine's full live map), and
    the recorded blocks and the counted ones add up to the blocks malloc gave."""
    command = ["-c", str(program("table_full")), "--engine", "preload", "--frames", "1", "3600"]
    result = run_command([*command, "--json"])
    assert result.returncode == 0, result.stderr
    made = int(re.search(r"^made (\d+)$", result.stdout, re.M).group(1))
    report = final_report(result)
    recorded = sum(group["count"] for group in report["groups"] if group["size"] == 56)
    missing = report["counters"]["live_map_full"]
    assert recorded >= 4096 and missing > 0 and recorded + missing == made
    assert report["complete"] is False
    text = run_command(command).stdout
    assert re.search(
        r"^INCOMPLETE: live figures are low \(up to \d+ allocations missing: live_map_full \d+\)$", text, re.M
    )


def test_backtrace_full_dump_names_module_and_function(program, tmp_path):
    result = run_with_library(
        [str(program("sites", "-rdynamic"))],
        f"backtrace backtrace_full backtrace_dump_on_exit backtrace_dump_prefix={tmp_path}/d",
    )
    assert result.returncode == 0, result.stderr
    lines = next(tmp_path.glob("d.*.exit.txt")).read_text().splitlines()
    infos = [line for line in lines if line.startswith("  bt_info")]
    records = [line for line in lines if line.startswith("z ") and not line.endswith("bt")]
    assert len(infos) == len(records) > 0
    # Each record with frames is followed by its bt_info line: {"module" rel_pc "function" offset} per frame.
    for record, info in zip(records, infos):
        frames = re.findall(r' \{"([^"]*)" ([0-9a-f]+) "([^"]*)" ([0-9a-f]+)\}', info)
        assert len(frames) == len(record.split("  bt ")[1].split())
    named = {
        function for info in infos for _, _, function, _ in re.findall(r'\{"([^"]*)" (\w+) "([^"]*)" (\w+)\}', info)
    }
    assert {"site_a", "site_b", "site_c", "site_d", "main"} <= named


def test_library_names_frames_as_leaktrace_does(program, tmp_path):
    """Started as ./sites and built without -rdynamic (its functions are in .symtab only): the
    library's bt_info lines name each frame as leaktrace does from the same dump (the path
    MAPS shows, the file's address, local functions and main), and so does its leak log."""
    built = program("sites")
    result = subprocess.run(
        [f"./{built.name}"],
        cwd=built.parent,
        capture_output=True,
        text=True,
        timeout=60,
        env=library_env(
            f"backtrace=4 backtrace_full backtrace_dump_on_exit leak_track backtrace_dump_prefix={tmp_path}/d"
        ),
    )
    assert result.returncode == 0, result.stderr
    (path,) = tmp_path.glob("d.*.exit.txt")
    text, pid = path.read_text(), int(path.name.split(".")[1])
    snapshot = read_heap_dump(text, pid, built.name, 0.0, credentials=Credentials(0, 0))
    rendered = render_heap_dump(Symbolizer(line_info=False).symbolize(snapshot), pid, backtrace_full=True)

    def program_frames(dump: str) -> list[list[tuple[str, ...]]]:
        """bt_info frames in the program (leaktrace also reads libc's separate debug file; the library does not)."""
        return [
            [frame for frame in re.findall(r'\{"([^"]*)" (\w+) "([^"]*)" (\w+)\}', line) if frame[0] == str(built)]
            for line in dump.splitlines()
            if line.startswith("  bt_info")
        ]

    assert program_frames(text) == program_frames(rendered)
    assert {frame[2] for frames in program_frames(text) for frame in frames} == {
        "site_a",
        "site_b",
        "site_c",
        "site_d",
        "main",
    }
    assert re.search(rf"^          #01  pc [0-9a-f]{{16}}  {re.escape(str(built))} \(main\+\d+\)$", result.stderr, re.M)


def test_attaching_to_a_library_without_options_never_sends_it_a_signal_it_would_die_of(program):
    """Started with the library but without LIBC_DEBUG_MALLOC_OPTIONS (or with them empty),
    the process has no handler for the dump signal: leaktrace reads its table in place and
    the process lives on."""

    for options in (None, ""):
        env = dict(os.environ, **library_env(options or ""))
        if options is None:
            del env["LIBC_DEBUG_MALLOC_OPTIONS"]
        target = subprocess.Popen([str(program("busy_heap")), "100", "1", "0"], env=env, stdout=subprocess.PIPE)
        try:
            assert target.stdout.readline() == b"ready\n"
            result = run_command(["-p", str(target.pid), "--engine", "preload", "--json", "0.3", "2"])
            final_report(result)
            assert "exited" not in result.stderr and target.poll() is None, (result.stderr, target.poll())
        finally:
            target.kill()
            target.wait()
