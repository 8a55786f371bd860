"""The trust model: leaktrace runs as root, and what a target names (its dump prefix, the
files at its dump paths, the MAPS of its dumps, a leak-info file) is hostile input. Root
never deletes or reads a file the target could not have, never waits on a FIFO or a
device, and never reads without a bound. Real files, real credentials, real processes."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from each import each

from leaktrace.analysis.symbolize import Symbolizer
from leaktrace.android.heap_dump import read_heap_dump
from leaktrace.model.snapshot import Credentials
from leaktrace.platform.target_files import RefusedFile, read_target_file, unlink_target_file

from conftest import PROGRAMS, leaktrace_command
from helpers import TIMEOUT, AttachedTrace, library_env, reports, run_command, sites, wait_for_line

NOBODY = pwd.getpwnam("nobody")
AS_NOBODY = Credentials(NOBODY.pw_uid, NOBODY.pw_gid, ())


@pytest.fixture
def nobodys_dir():
    """A directory the unprivileged user nobody owns, inside one everybody can enter."""
    top = tempfile.mkdtemp(prefix="leaktrace-trust-")
    os.chmod(top, 0o755)
    mine = Path(top, "nobody")
    mine.mkdir()
    os.chown(mine, NOBODY.pw_uid, NOBODY.pw_gid)
    yield mine
    shutil.rmtree(top)


def owned_by_nobody(path: Path) -> Path:
    os.lchown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    return path


def test_a_file_the_target_owns_is_read(nobodys_dir):
    dump = nobodys_dir / "dump.txt"
    dump.write_text("Android Native Heap Dump v1.2\n")
    owned_by_nobody(dump)
    assert read_target_file(AS_NOBODY, str(dump), 1 << 20) == b"Android Native Heap Dump v1.2\n"
    assert read_target_file(AS_NOBODY, str(nobodys_dir / "none.txt"), 1 << 20) is None


def test_what_a_target_plants_is_refused_without_waiting(nobodys_dir, tmp_path):
    secret = tmp_path / "secret"  # root's, mode 0600, in a directory nobody cannot enter
    secret.write_text("root only")
    secret.chmod(0o600)
    open_to_all = nobodys_dir / "roots.txt"  # root's, readable by all: not the target's to hand over
    open_to_all.write_text("root's")
    planted = {
        "to_dev_zero": ("symlink", "/dev/zero", "symbolic link"),
        "to_secret": ("symlink", str(secret), "symbolic link"),
        "fifo": ("fifo", None, "not a regular file"),
        "roots": ("file", None, f"owned by uid 0, not by the target's uid {NOBODY.pw_uid}"),
    }
    for name, (kind, target, _) in planted.items():
        path = nobodys_dir / name
        if kind == "symlink":
            path.symlink_to(target)
            owned_by_nobody(path)
        elif kind == "fifo":
            os.mkfifo(path, 0o600)
            owned_by_nobody(path)
        else:
            shutil.copy(open_to_all, path)
    for name, (_, _, reason) in planted.items():
        started = time.monotonic()
        with pytest.raises(RefusedFile, match=reason):
            read_target_file(AS_NOBODY, str(nobodys_dir / name), 1 << 20)
        assert time.monotonic() - started < 1
    with pytest.raises(RefusedFile, match="Permission denied"):  # nobody cannot open it, so root will not
        read_target_file(AS_NOBODY, str(secret), 1 << 20)
    big = nobodys_dir / "big.txt"
    big.write_bytes(b"x" * (2 << 20))
    owned_by_nobody(big)
    with pytest.raises(RefusedFile, match="larger than 1 MiB"):
        read_target_file(AS_NOBODY, str(big), 1 << 20)
    assert secret.read_text() == "root only"


def test_root_removes_only_what_the_target_may(tmp_path, nobodys_dir):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    tmp_path.chmod(0o755)  # nobody may look, not write
    with pytest.raises(RefusedFile, match="Permission denied"):
        unlink_target_file(AS_NOBODY, str(victim))
    assert victim.read_text() == "keep me"
    own = nobodys_dir / "own.txt"
    own.write_text("old dump")
    owned_by_nobody(own)
    unlink_target_file(AS_NOBODY, str(own))
    assert not own.exists()
    unlink_target_file(AS_NOBODY, str(own))  # none there: nothing to do


def test_the_callers_credentials_are_untouched(nobodys_dir):
    """Only the short-lived thread takes the target's identity."""
    before = Path("/proc/thread-self/status").read_text().split("Uid:")[1].split("\n")[0]
    own = nobodys_dir / "own.txt"
    own.write_text("dump")
    owned_by_nobody(own)
    assert read_target_file(AS_NOBODY, str(own), 1 << 20) == b"dump"
    assert Path("/proc/thread-self/status").read_text().split("Uid:")[1].split("\n")[0] == before
    assert before.split() == ["0"] * 4 and os.access("/root", os.W_OK)


def test_a_damaged_dump_is_a_value_error_never_a_traceback_or_a_huge_number():
    good = (
        "Android Native Heap Dump v1.2\n\nBuild fingerprint: ''\n\nTotal memory: 10\nAllocation records: 1\n"
        "Backtrace size: 4\n\nz 0  sz       10  num    1  bt 401000\nMAPS\n"
        "00400000-00401000 r-xp 00000000 08:01 12 /bin/true\nEND\n"
    )
    assert read_heap_dump(good, 7, "x", 0.0).groups[0].size == 10
    for bad in (
        good.replace("Backtrace size: 4", "Backtrace size: x"),
        good.replace("sz       10", "sz " + "9" * 5000),
        good.replace("num    1", "num 99999999999"),
        good.replace("bt 401000", "bt " + " ".join(["1"] * 300)),
        good.replace("00400000-00401000", "zz-yy"),
    ):
        with pytest.raises(ValueError):
            read_heap_dump(bad, 7, "x", 0.0)


def test_a_dump_whose_maps_name_a_fifo_or_a_device_symbolizes_at_once(tmp_path):
    fifo = tmp_path / "lib.so"
    os.mkfifo(fifo)
    text = (
        "Android Native Heap Dump v1.2\n\nBacktrace size: 4\n\n"
        "z 0  sz       10  num    1  bt 401010 502010\nMAPS\n"
        f"00400000-00402000 r-xp 00000000 08:01 12 {fifo}\n"
        "00500000-00503000 r-xp 00000000 08:01 13 /dev/zero\nEND\n"
    )
    snapshot = read_heap_dump(text, 7, "x", 0.0)
    done = []
    worker = threading.Thread(target=lambda: done.append(Symbolizer().symbolize(snapshot)), daemon=True)
    worker.start()
    worker.join(10)
    assert done, "the symbolizer waited on a FIFO"
    frames = done[0].stack_of(snapshot.groups[0])
    assert [frame.module for frame in frames] == [str(fifo), "/dev/zero"]
    assert all(frame.function is None for frame in each(frames))


def test_a_dump_cannot_make_root_read_a_module_the_target_may_not(program, tmp_path):
    """A dump's MAPS may name any file: module files are opened with the target's rights, so
    the symbols of a program only root may read never reach a report (nor a heap dump)."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    secret = private / "tool"
    shutil.copy(program("idle"), secret)
    secret.chmod(0o700)
    symbols = subprocess.run(["nm", str(secret)], capture_output=True, text=True, check=True).stdout
    keep_some = int(next(line.split()[0] for line in symbols.splitlines() if line.endswith(" keep_some")), 16)
    start = 0x555555554000
    text = (
        "Android Native Heap Dump v1.2\n\nBacktrace size: 4\n\n"
        f"z 0  sz       10  num    1  bt {start + keep_some + 4:x}\nMAPS\n"
        f"{start:x}-{start + secret.stat().st_size:x} r-xp 00000000 08:01 12 {secret}\nEND\n"
    )
    for credentials, function in ((AS_NOBODY, None), (Credentials(0, 0), "keep_some")):
        snapshot = read_heap_dump(text, 7, "x", 0.0, credentials=credentials)
        [frame] = Symbolizer().symbolize(snapshot).stack_of(snapshot.groups[0])
        assert (frame.module, frame.function) == (str(secret), function)


@contextmanager
def reachable_by_nobody(path: str):
    """Lets nobody enter each directory above path for the test (CI's clone may sit in a
    0700 directory); restores their modes after."""
    changed = []
    for parent in Path(path).parents:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)
            changed.append((parent, mode))
    try:
        yield
    finally:
        for parent, mode in changed:
            parent.chmod(stat.S_IMODE(mode))


@contextmanager
def idle_as_nobody(program, options: str, seconds: int):
    """tests/integration/programs/idle.c run as nobody with the preload library, told options."""
    from leaktrace.sources.preload.trace import preload_library

    binary = Path(tempfile.mkdtemp(prefix="leaktrace-idle-"))
    binary.chmod(0o755)
    shutil.copy(program("idle"), binary / "idle")
    with reachable_by_nobody(preload_library()):
        target = subprocess.Popen(
            [
                "setpriv",
                f"--reuid={NOBODY.pw_uid}",
                f"--regid={NOBODY.pw_gid}",
                "--clear-groups",
                str(binary / "idle"),
                str(seconds),
            ],
            env=library_env(options),
        )
        try:
            time.sleep(0.3)
            yield target
        finally:
            target.kill()
            target.wait()
            shutil.rmtree(binary)


def test_attach_does_not_delete_a_root_file_the_target_names(program, tmp_path):
    """A process of nobody's whose dump prefix points into a directory of root's: the dump path
    is never removed with root's rights, and the reports come from its table read in place."""
    tmp_path.chmod(0o755)
    with idle_as_nobody(program, f"backtrace=8 backtrace_dump_prefix={tmp_path}/victim", 4) as target:
        victim = tmp_path / f"victim.{target.pid}.txt"
        victim.write_text("keep me")
        result = run_command(["-p", str(target.pid), "--engine", "preload", "--json", "0.3", "2"], timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert victim.read_text() == "keep me"
    assert f"refusing to remove {victim}: Permission denied; reading pid {target.pid}'s table in place" in result.stderr
    assert "Traceback" not in result.stderr
    found = reports(result.stdout)
    assert len(found) == 2 and all(sites(report)["keep_some"] == [(4321, 5)] for report in found)


@pytest.mark.parametrize("planted", ["symlink to /dev/zero", "fifo", "root's file", "damaged"])
def test_a_planted_exit_dump_is_refused_and_the_final_report_kept(program, nobodys_dir, planted):
    """The exit dump is read after the process is gone: whatever sits at its path, leaktrace
    says why it is not read, keeps its last report as final, and exits 0 at once."""
    prefix = nobodys_dir / "heap"
    with idle_as_nobody(program, f"backtrace=8 backtrace_dump_prefix={prefix}", 4) as target:
        path = Path(f"{prefix}.{target.pid}.exit.txt")
        if planted == "symlink to /dev/zero":
            path.symlink_to("/dev/zero")
            owned_by_nobody(path)
        elif planted == "fifo":
            os.mkfifo(path, 0o600)
            owned_by_nobody(path)
        elif planted == "root's file":
            path.write_text("Android Native Heap Dump v1.2\n")
        else:
            path.write_text("Android Native Heap Dump v1.2\nz 0  sz 1  num 1  bt\n")
            owned_by_nobody(path)
        started = time.monotonic()
        result = run_command(["-p", str(target.pid), "--engine", "preload", "--json", "0.3"], timeout=30)
    assert time.monotonic() - started < 15
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    reason = {
        "symlink to /dev/zero": "it is a symbolic link",
        "fifo": "not a regular file",
        "root's file": "owned by uid 0",
        "damaged": "is damaged",
    }[planted]
    assert reason in result.stderr and "table in place" in result.stderr, result.stderr
    final = reports(result.stdout)[-1]
    assert final["processes"][0]["exited"] and sites(final)["keep_some"] == [(4321, 5)]


def test_decode_leak_info_refuses_devices_and_bounds_its_input(tmp_path):
    started = time.monotonic()
    result = run_command(["decode-leak-info", "/dev/zero", "--backtrace-size", "4"], timeout=30)
    assert result.returncode == 1 and "cannot read /dev/zero: not a regular file" in result.stderr
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result = run_command(["decode-leak-info", str(fifo), "--backtrace-size", "4"], timeout=30)
    assert result.returncode == 1 and "not a regular file" in result.stderr
    assert time.monotonic() - started < 20
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate((256 << 20) + 48)
    result = run_command(["decode-leak-info", str(big), "--backtrace-size", "4"], timeout=60)
    assert result.returncode == 1 and "larger than 256 MiB" in result.stderr
    result = run_command(["decode-leak-info", str(big), "--backtrace-size", "300"], timeout=30)
    assert result.returncode == 2 and "--backtrace-size must be from 1 to 256, not 300" in result.stderr
    assert "Traceback" not in result.stderr


def test_decode_leak_info_flags_entries_that_cannot_be_real(tmp_path):
    words = [[100, 1, 0x401000, 0], [1 << 40, 1, 0x401000, 0], [8, 0, 0x401000, 0], [8, 1, 0, 0x401000]]
    buffer = tmp_path / "odd.bin"
    buffer.write_bytes(b"".join(w.to_bytes(8, "little") for entry in words for w in entry))
    result = run_command(["decode-leak-info", str(buffer), "--backtrace-size", "2"], timeout=30)
    assert result.returncode == 0, result.stderr
    marked = [line for line in result.stdout.splitlines() if "!" in line]
    assert [line.split("!")[1] for line in marked] == [
        "size above 2^31",
        "no allocations",
        "pcs after the zero padding",
    ]
    assert "3 entries cannot be real (marked !)" in result.stderr


@pytest.mark.parametrize("mode", [0o711, 0o755])
def test_a_program_its_process_may_not_read_is_not_read_for_it(program, mode):
    """A process of nobody's runs a program it may execute but not read (mode 0711): its
    symbols and unwind rows are not read either; the same program readable by all is (control)."""
    directory = Path(tempfile.mkdtemp(prefix="leaktrace-exec-only-"))
    directory.chmod(0o755)
    binary = directory / "workers"
    shutil.copy(program("workers"), binary)
    binary.chmod(mode)
    target = subprocess.Popen(
        ["setpriv", f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}", "--clear-groups", str(binary), "leak"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for_line(target.stdout).startswith("ready")
        trace = AttachedTrace(target.pid, "0.3")
        target.send_signal(signal.SIGUSR1)
        assert wait_for_line(target.stdout).startswith("ready")
        time.sleep(0.8)
        _, out, err = trace.stop()
    finally:
        target.kill()
        target.wait()
        shutil.rmtree(directory)
    assert "Traceback" not in err
    [group] = [g for g in reports(out)[-1]["groups"] if g["size"] == 1000]
    frame = group["frames"][0]
    assert group["count"] == 5 and frame["module"] == str(binary)
    assert frame["function"] == (None if mode == 0o711 else "leak_site")


def test_names_a_target_chooses_reach_the_report_without_their_escapes(program, tmp_path):
    """A program and a library whose file names carry terminal escape sequences: the text
    report names them with the control characters written out, never the raw bytes."""
    binary = tmp_path / "x\x1b]2;pwned\x07"
    library = tmp_path / "lib\x1b[2Jplugin.so"
    shutil.copy(program("uses_plugin", "-ldl"), binary)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(PROGRAMS / "plugin.c")], check=True)
    result = run_command(["-c", f"'{binary}' '{library}'"])
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert "pid" in result.stdout and "(x\\x1b]2;pwned\\x07)" in result.stdout
    assert "plugin_leak+0x" in result.stdout and "(lib\\x1b[2Jplugin.so)" in result.stdout


@pytest.mark.parametrize("option", ["--pprof", "--folded", "--html", "--leak-info", "--heap-dump"])
def test_an_output_path_that_is_not_a_regular_file_is_refused_before_the_trace(option, program, tmp_path):
    """Root must never turn /dev/full or a FIFO into a regular file: the path is refused in
    one line, exit 2, before anything is attached, and is left as it was. --heap-dump takes
    a prefix; PREFIX.PID.txt is what is checked."""
    fifo = tmp_path / ("fifo.PID.txt" if option == "--heap-dump" else "fifo")
    os.mkfifo(fifo)
    places = [(str(fifo), "a FIFO")]
    if option != "--heap-dump":
        places += [("/dev/full", "a character device"), (str(tmp_path), "a directory")]
    for path, kind in places:
        before = os.lstat(path)
        given = path.removesuffix(".PID.txt") if option == "--heap-dump" else path
        result = run_command(["-c", str(program("idle")), "1", "1", option, given])
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == [f"leaktrace: refusing {option} {path}: it is {kind}, not a regular file"]
        after = os.lstat(path)
        assert (after.st_mode, after.st_rdev, after.st_ino) == (before.st_mode, before.st_rdev, before.st_ino)
    missing = tmp_path / "no" / "such" / "file"
    result = run_command(["-c", str(program("idle")), "1", "1", option, str(missing)])
    assert result.returncode == 2 and "probes live" not in result.stderr
    assert f"{tmp_path / 'no' / 'such'} is not a directory" in result.stderr


def test_an_output_that_became_a_fifo_during_the_trace_is_left_alone(tmp_path):
    from leaktrace.errors import RuntimeFailure
    from leaktrace.platform.atomic_write import write_atomically

    fifo = tmp_path / "out.folded"
    os.mkfifo(fifo)
    with pytest.raises(RuntimeFailure, match="it is a FIFO, not a regular file"):
        write_atomically(str(fifo), b"main 1\n")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and sorted(os.listdir(tmp_path)) == ["out.folded"]
    write_atomically(str(tmp_path / "ok"), b"x")
    assert (tmp_path / "ok").read_bytes() == b"x"


def roots_directory_of_files(tmp_path: Path, count: int) -> Path:
    victims = tmp_path / "roots"
    victims.mkdir(mode=0o700)
    for i in range(count):
        (victims / f"{i:04x}").write_text("root's")
        os.utime(victims / f"{i:04x}", (i, i))  # older than anything leaktrace writes
    return victims


def test_the_cache_directory_is_not_reached_through_a_users_symlink(program, nobodys_dir, tmp_path):
    """LEAKTRACE_CACHE_DIR=DIR/cache where DIR is nobody's and cache a symlink to a directory
    of root's: the cache is not used (one line says why) and not one of root's files goes.
    A symlink is not followed even in a directory of root's."""
    victims = roots_directory_of_files(tmp_path, 1100)
    roots_link = tmp_path / "link"
    roots_link.symlink_to(victims)
    users_link = nobodys_dir / "cache"
    users_link.symlink_to(victims)
    owned_by_nobody(users_link)
    for cache, refused in (
        (users_link, f"{nobodys_dir}: it is owned by uid {NOBODY.pw_uid}"),
        (nobodys_dir / "made", f"{nobodys_dir}: it is owned by uid {NOBODY.pw_uid}"),
        (roots_link, f"{roots_link}: a symbolic link or not a directory"),
        (roots_link / "unwind", f"{roots_link}: a symbolic link or not a directory"),
    ):
        result = run_command(
            ["-c", str(program("idle")), "1", "1"], env=dict(os.environ, LEAKTRACE_CACHE_DIR=str(cache))
        )
        assert result.returncode == 0 and "Traceback" not in result.stderr
        assert f"leaktrace: unwind table cache not used: {refused}\n" in result.stderr
        assert sorted(os.listdir(victims)) == [f"{i:04x}" for i in range(1100)]
    assert not (nobodys_dir / "made").exists()


def test_pruning_removes_only_leaktraces_own_files(tmp_path):
    from leaktrace.unwind.tables import CACHE_FORMAT, CACHE_KEEP, FileTable, TableCache

    cache = roots_directory_of_files(tmp_path, 1100)  # not leaktrace's names
    ours = [f"{i:064x}.v{CACHE_FORMAT}" for i in range(CACHE_KEEP + 5)]
    for i, name in enumerate(ours):
        (cache / name).write_bytes(b"old")
        os.utime(cache / name, (2000 + i, 2000 + i))
    (cache / f"{'e' * 64}.v{CACHE_FORMAT}x").symlink_to("/etc/passwd")
    table_cache = TableCache(str(cache))
    assert table_cache.usable
    table_cache.store("f" * 64, FileTable(b"", b"", 0))
    left = set(os.listdir(cache))
    assert {f"{i:04x}" for i in range(1100)} <= left  # every foreign file kept
    assert sum(1 for name in left if name.endswith(f".v{CACHE_FORMAT}")) == CACHE_KEEP
    assert ours[0] not in left and ours[5] not in left and ours[6] in left and f"{'f' * 64}.v{CACHE_FORMAT}" in left


def as_nobody_with(capabilities: str, *args: str) -> subprocess.CompletedProcess:
    """leaktrace ARGS as nobody, with these capabilities (comma-separated, setpriv's names) or none."""
    caps = [f"--inh-caps={capabilities}", f"--ambient-caps={capabilities}"] if capabilities else []
    setpriv = ["setpriv", f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}", "--clear-groups", *caps]
    return subprocess.run([*setpriv, *leaktrace_command(*args)], capture_output=True, text=True, timeout=TIMEOUT)


BPF_CAPS = "+bpf,+perfmon"
OTHER_USERS_CAPS = BPF_CAPS + ",+sys_ptrace,+setuid,+setgid,+dac_read_search"


def test_each_mode_runs_with_the_capabilities_the_readme_names(program):
    """Not root: -c with CAP_BPF and CAP_PERFMON; -p of another user's process with those and
    CAP_SYS_PTRACE, CAP_SETUID, CAP_SETGID and CAP_DAC_READ_SEARCH (--unreachable and heap -p
    too); --engine preload -c with none. A capability missing is one line, never a traceback."""
    from leaktrace.sources.preload.trace import preload_library

    programs = Path(tempfile.mkdtemp(prefix="leaktrace-caps-"))
    programs.chmod(0o755)
    shutil.copy(program("sites"), programs / "sites")
    shutil.copy(program("busy_heap"), programs / "busy_heap")
    sites_exact = {"site_a": [(16, 10)], "site_b": [(16, 10)], "site_c": [(16, 10)], "site_d": [(16, 20)]}
    roots = subprocess.Popen([str(programs / "busy_heap"), "100", "1", "60000"], stdout=subprocess.PIPE)
    try:
        with reachable_by_nobody(preload_library()):
            assert roots.stdout.readline() == b"ready\n"
            for caps, engine in ((BPF_CAPS, "bpf"), ("", "preload")):
                result = as_nobody_with(caps, "-c", str(programs / "sites"), "--engine", engine, "--json", "3600")
                assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
                found = {
                    name: value for name, value in sites(reports(result.stdout)[-1]).items() if name in sites_exact
                }
                assert found == sites_exact
            result = as_nobody_with(BPF_CAPS, "-p", str(roots.pid), "1", "1")
            assert result.returncode == 1 and "Traceback" not in result.stderr
            assert result.stderr.splitlines()[-1].endswith(
                "needs CAP_SETUID and CAP_SETGID, which leaktrace does not have"
            )
            result = as_nobody_with(OTHER_USERS_CAPS, "-p", str(roots.pid), "--unreachable", "--json", "1", "1")
            assert result.returncode == 0 and "Traceback" not in result.stderr and "skipped" not in result.stderr
            assert reports(result.stdout)[-1]["counters"]["allocations"] > 0
            result = as_nobody_with(OTHER_USERS_CAPS, "heap", "-p", str(roots.pid))
            assert result.returncode == 0 and result.stdout.startswith(f"heap of pid {roots.pid}"), result.stderr
            result = as_nobody_with("", "heap", "-p", str(roots.pid))
            assert (
                result.returncode == 1
                and result.stderr == f"leaktrace: cannot read pid {roots.pid}: Permission denied\n"
            )
    finally:
        roots.kill()
        roots.wait()
        shutil.rmtree(programs)


@pytest.fixture
def sticky_dir():
    """A directory like /tmp: everybody may write to it, sticky."""
    top = Path(tempfile.mkdtemp(prefix="leaktrace-sticky-"))
    os.chmod(top, 0o1777)
    yield top
    shutil.rmtree(top)


def suppressions_refused(path: Path) -> str:
    """leaktrace --suppressions PATH: refused before anything runs, in one line (exit 2)."""
    result = subprocess.run(
        leaktrace_command("-c", "/bin/true", "--leak-check", "--suppressions", str(path)),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_a_suppressions_link_another_user_planted_is_not_followed(sticky_dir, tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secret-hash:19000:0:99999:7:::\n")
    secret.chmod(0o600)
    link = sticky_dir / "known-leaks.supp"
    link.symlink_to(secret)
    owned_by_nobody(link)
    line = suppressions_refused(link)
    assert "symbolic link that a user other than root could have made" in line and "secret" not in line
    # Through a planted directory link too, and a file nobody owns in the sticky directory.
    (sticky_dir / "dir").symlink_to(tmp_path)
    owned_by_nobody(sticky_dir / "dir")
    assert "symbolic link" in suppressions_refused(sticky_dir / "dir" / "shadow")
    planted = sticky_dir / "planted.supp"
    planted.write_text("leak:main\n")
    owned_by_nobody(planted)
    assert "owned by uid" in suppressions_refused(planted)


def test_a_suppressions_fifo_and_an_oversized_file_are_refused_without_waiting(tmp_path):
    fifo = tmp_path / "fifo.supp"
    os.mkfifo(fifo)
    assert "not a regular file" in suppressions_refused(fifo)  # no writer: an open that waited would hang
    large = tmp_path / "large.supp"
    block = "{\n   known\n   Memcheck:Leak\n   fun:malloc\n   fun:main\n}\n"
    with open(large, "w") as f:
        f.write(block * ((100 << 20) // len(block)))
    line = suppressions_refused(large)
    assert "is larger than 4 MiB" in line and "closing" not in line, line
