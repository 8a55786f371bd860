"""Symbols and lines from separate debug files: by build-id (Debian's libc6-dbg, for libc),
by .gnu_debuglink (a stripped program whose debug file lies beside it), from a debuginfod
server; and inlined functions as frames of their own."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time

from each import each

from leaktrace.platform.elf import ElfFile

from helpers import final_report, run_command


def frames_of(report: dict) -> list[list[tuple[str | None, str | None, int | None]]]:
    return [
        [(frame["function"], frame["file"], frame["line"]) for frame in group["frames"]] for group in report["groups"]
    ]


def stripped_with_debug_file(program, tmp_path, name: str = "sites"):
    """The program stripped of .symtab and DWARF, its debug file beside it, named by a debuglink."""
    built = tmp_path / name
    shutil.copy(program(name), built)
    debug = tmp_path / f"{name}.debug"
    subprocess.run(["objcopy", "--only-keep-debug", str(built), str(debug)], check=True)
    subprocess.run(["objcopy", "--strip-all", f"--add-gnu-debuglink={debug}", str(built)], check=True)
    return built, debug


def test_stripped_program_and_libc_are_named_from_their_debug_files(program, tmp_path):
    built, _ = stripped_with_debug_file(program, tmp_path)
    report = final_report(run_command(["-c", str(built), "--json"]))
    stacks = frames_of(report)
    assert sorted(stack[0][0] for stack in stacks) == ["site_a", "site_b", "site_c", "site_d"]
    for stack in stacks:
        function, file, line = stack[0]
        assert file.endswith("tests/integration/programs/sites.c") and line in (7, 8, 9, 10)
        assert stack[1][0] == "main" and stack[1][1].endswith("sites.c")
        # libc6-dbg, found by libc's build-id: the static function that calls main, with its line.
        assert (
            stack[2][0] == "__libc_start_call_main"
            and stack[2][1].endswith("libc_start_call_main.h")
            and stack[2][2] > 0
        )
        assert stack[3][0] == "__libc_start_main"  # the exported name, over the debug file's aliases


def test_a_debug_file_of_another_build_is_not_used(program, tmp_path):
    """The debuglink's CRC-32 must match: a debug file of another build under the same name is ignored."""
    built, debug = stripped_with_debug_file(program, tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(program("sites", "-O1"), other / "sites")
    subprocess.run(["objcopy", "--only-keep-debug", str(other / "sites"), str(debug)], check=True)
    report = final_report(run_command(["-c", str(built), "--json"]))
    assert all(stack[0][0] is None and stack[0][1] is None for stack in each(frames_of(report)))


def test_inlined_function_is_a_frame_of_its_own(program, tmp_path):
    """-O2 -g, a static inline helper that calls malloc: its frame is shown, marked inlined,
    between malloc's caller and the function it was inlined into, in JSON, text and pprof."""
    built = program("inlined", "-O2")
    report = final_report(run_command(["-c", str(built), "--json"]))
    (group,) = report["groups"]
    assert (group["size"], group["count"]) == (48, 8)
    frames = [(f["function"], f["inlined"], (f["file"] or "").rsplit("/", 1)[-1], f["line"]) for f in group["frames"]]
    assert frames[:3] == [
        ("make_block", True, "inlined.c", 8),
        ("site", False, "inlined.c", 13),
        ("main", False, "inlined.c", 19),
    ]
    pprof = tmp_path / "inlined.pb.gz"
    text = run_command(["-c", str(built), "--pprof", str(pprof)]).stdout
    assert "make_block (inlined) /" in text and "site+0x" in text
    traces = subprocess.run(
        [shutil.which("go") or "/usr/bin/go", "tool", "pprof", "-traces", str(pprof)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert re.search(r"make_block \(inline\)\n\s+site\n\s+main\n", traces.stdout), traces.stdout + traces.stderr


def test_debug_file_from_a_debuginfod_server(program, tmp_path):
    """A stripped program whose debug file only a debuginfod server has (elfutils' debuginfod on
    loopback, indexing a folder): with DEBUGINFOD_URLS set, its functions and lines are named."""
    served = tmp_path / "served"
    served.mkdir()
    built, debug = stripped_with_debug_file(program, tmp_path)
    subprocess.run(["objcopy", "--remove-section=.gnu_debuglink", str(built)], check=True)
    debug.rename(served / debug.name)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        ["debuginfod", "-F", str(served), "-p", str(port), "-d", str(tmp_path / "index.sqlite"), "-t", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = {
        **os.environ,
        "DEBUGINFOD_URLS": f"http://127.0.0.1:{port}",
        "DEBUGINFOD_CACHE_PATH": str(tmp_path / "cache"),
    }
    try:
        build_id = ElfFile(str(built)).build_id
        deadline = time.monotonic() + 60
        while (
            subprocess.run(
                ["debuginfod-find", "debuginfo", build_id],
                env={**env, "DEBUGINFOD_CACHE_PATH": str(tmp_path / "probe-cache")},
                capture_output=True,
            ).returncode
            != 0
        ):
            assert time.monotonic() < deadline, "debuginfod did not index the folder"
            shutil.rmtree(tmp_path / "probe-cache", ignore_errors=True)
            time.sleep(0.5)
        unset = {name: value for name, value in os.environ.items() if name != "DEBUGINFOD_URLS"}
        without = final_report(run_command(["-c", str(built), "--json"], env=unset))
        assert all(stack[0][0] is None for stack in each(frames_of(without)))
        report = final_report(run_command(["-c", str(built), "--json"], env=env))
        assert sorted(stack[0][0] for stack in frames_of(report)) == ["site_a", "site_b", "site_c", "site_d"]
        assert all(stack[0][1].endswith("sites.c") for stack in each(frames_of(report)))
    finally:
        server.kill()
        server.wait()


def with_mini_debug_info(program, tmp_path, name: str = "sites"):
    """The program stripped of everything, with a MiniDebugInfo of its static and global
    functions in .gnu_debugdata, made the way Fedora makes it (nm, objcopy, xz)."""
    original, built = program(name), tmp_path / name

    def names(*options: str) -> set[str]:
        listing = subprocess.run(
            ["nm", *options, "--format=posix", "--defined-only", str(original)],
            capture_output=True,
            text=True,
            check=True,
        )
        return {line.split()[0] for line in listing.stdout.splitlines() if line.split()[1] in "Tt" or "-D" in options}

    (tmp_path / "keep").write_text("\n".join(sorted(names() - names("-D"))) + "\n")
    mini = tmp_path / "mini"
    subprocess.run(["objcopy", "--only-keep-debug", str(original), str(mini)], check=True)
    subprocess.run(
        ["objcopy", "-S", "--remove-section", ".comment", f"--keep-symbols={tmp_path / 'keep'}", str(mini)], check=True
    )
    subprocess.run(["xz", "-f", str(mini)], check=True)
    subprocess.run(["strip", "--strip-all", "-R", ".comment", "-o", str(built), str(original)], check=True)
    subprocess.run(["objcopy", "--add-section", f".gnu_debugdata={mini}.xz", str(built)], check=True)
    return built


def test_a_stripped_program_is_named_from_its_mini_debug_info(program, tmp_path):
    """No .symtab, no debug file, no debuginfod: the functions come from .gnu_debugdata (without lines)."""
    built = with_mini_debug_info(program, tmp_path)
    assert not ElfFile(str(built)).has_symtab
    report = final_report(run_command(["-c", str(built), "--json"], env={**os.environ, "DEBUGINFOD_URLS": ""}))
    stacks = frames_of(report)
    assert sorted(stack[0][0] for stack in stacks) == ["site_a", "site_b", "site_c", "site_d"]
    assert all(stack[1][:2] == ("main", None) for stack in each(stacks))
