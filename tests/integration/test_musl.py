"""Programs on musl's libc (Debian's musl-gcc: /lib/ld-musl-x86_64.so.1, which is its libc too):
both engines trace them exactly, launched and attached, and in a root laid out as Alpine's
(the loader is the libc, a file of its own: Debian's musl libc.so copied there), chrooted and
in a podman container imported from it. The in-process engine uses its build for musl
(malloc_debug_musl.so): the glibc build would stop a musl program from starting. A CPython on
musl is not walked (one line)."""

from __future__ import annotations

import shutil
import subprocess
import uuid

import pytest
from test_containers import PODMAN, RUN

from conftest import PROGRAMS
from helpers import attach_target_traced, fake_python_traced, final_report, run_command, sites

pytestmark = pytest.mark.usefixtures("cpu_hogs")
MUSL_LIBRARY = "malloc_debug_musl.so"
SITES = {"site_a": [(16, 10)], "site_b": [(16, 10)], "site_c": [(16, 10)], "site_d": [(16, 20)]}


@pytest.fixture(scope="module")
def musl(build_dir):
    def build(name: str):
        out = build_dir / f"{name}_musl"
        subprocess.run(["musl-gcc", "-O0", "-g", "-o", str(out), str(PROGRAMS / f"{name}.c")], check=True)
        return out

    return build


@pytest.mark.parametrize("engine", ["bpf", "preload"])
def test_a_musl_command_is_counted_exactly(musl, engine):
    result = run_command(["-c", str(musl("sites")), "--engine", engine, "--json", "3600"])
    assert {name: sites(final_report(result)).get(name) for name in SITES} == SITES
    assert engine == "bpf" or MUSL_LIBRARY in result.stderr, result.stderr


def attached_exactly(argv: list[str], library: str, engine: str = "bpf") -> None:
    """attach_target traced exactly by engine, through library (the end of its path from here)."""
    pid_of = (lambda target: podman_pid(argv)) if argv[0] == "podman" else (lambda target: target.pid)
    _, start_line = attach_target_traced(argv, pid_of, "--engine", engine)
    said = f"{library} (musl):" if engine == "bpf" else f"{MUSL_LIBRARY} (attached in-process"
    assert said in start_line, start_line


def podman_pid(argv: list[str]) -> int:
    """The host pid of the container that argv (podman run --name NAME ...) started."""
    name = argv[argv.index("--name") + 1]
    found = subprocess.run([*PODMAN, "inspect", "-f", "{{.State.Pid}}", name], capture_output=True, text=True)
    return int(found.stdout)


@pytest.mark.parametrize("engine", ["bpf", "preload"])
def test_an_attached_musl_process_is_counted_exactly(musl, engine):
    attached_exactly([str(musl("attach_target"))], "/usr/lib/x86_64-linux-musl/libc.so", engine)


@pytest.fixture(scope="module")
def alpine_root(musl, tmp_path_factory):
    """A root laid out as Alpine's: its libc is its loader, lib/ld-musl-x86_64.so.1 (a copy of
    Debian's musl libc.so, not a link), and bin/attach_target names it as its interpreter."""
    root = tmp_path_factory.mktemp("alpine")
    for directory in ("lib", "bin", "proc"):
        (root / directory).mkdir()
    shutil.copy("/usr/lib/x86_64-linux-musl/libc.so", root / "lib" / "ld-musl-x86_64.so.1")
    shutil.copy(musl("attach_target"), root / "bin" / "attach_target")
    return root


@pytest.mark.parametrize("engine", ["bpf", "preload"])
def test_a_process_in_an_alpine_root_is_counted_exactly(alpine_root, engine):
    """Chrooted, with a procfs at its /proc (an attach loads the library by /proc/thread-self/fd),
    mounted in a mount namespace of its own: the same pid from unshare to attach_target."""
    chrooted = f"mount -t proc proc {alpine_root}/proc && exec chroot {alpine_root} /bin/attach_target"
    attached_exactly(["unshare", "-m", "sh", "-c", chrooted], f"{alpine_root}/lib/ld-musl-x86_64.so.1", engine)


@pytest.mark.parametrize("engine", ["bpf", "preload"])
def test_a_process_in_an_alpine_container_is_counted_exactly(alpine_root, engine):
    """The Alpine-laid root imported as a podman image: the loader is named inside the
    container's root as the host sees it (/proc/PID/root/lib/...)."""
    image = f"leaktrace-test-alpine-layout:{uuid.uuid4().hex[:8]}"
    tar = subprocess.Popen(["tar", "-C", str(alpine_root), "-c", "."], stdout=subprocess.PIPE)
    imported = subprocess.run([*PODMAN, "import", "-", image], stdin=tar.stdout, capture_output=True, timeout=600)
    tar.wait()
    assert imported.returncode == 0, imported.stderr
    name = f"leaktrace-test-{uuid.uuid4().hex[:12]}"
    try:
        argv = [*PODMAN, *RUN, "--name", name, image, "/bin/attach_target"]
        attached_exactly(argv, "/root/lib/ld-musl-x86_64.so.1", engine)
    finally:
        subprocess.run([*PODMAN, "rm", "-f", "-t", "0", name], capture_output=True)
        subprocess.run([*PODMAN, "rmi", "-f", image], capture_output=True)


def test_a_cpython_on_musl_is_not_walked_and_says_so_once(tmp_path):
    """fake_python (what the walk checks for CPython 3.11) built for musl: the walk would read
    glibc's thread layout in it, so it is not walked; one line says so, and its blocks are exact."""
    fake = tmp_path / "python3.11"
    source = PROGRAMS / "fake_python.c"
    subprocess.run(["musl-gcc", "-O0", "-g", "-rdynamic", "-o", str(fake), str(source)], check=True)
    result = fake_python_traced(fake)
    said = [line for line in result.stderr.splitlines() if "on musl" in line]
    assert said == [
        f"leaktrace: {fake} is CPython on musl: its Python frames are left out "
        "(the walk knows glibc's thread layout, not musl's)"
    ], result.stderr
