"""Programs on musl's libc (Debian's musl-gcc: /lib/ld-musl-x86_64.so.1, which is its libc too):
the BPF engine traces them exactly, launched and attached, and in a root laid out as Alpine's
(the loader is the libc, a file of its own: Debian's musl libc.so copied there), chrooted and
in a podman container imported from it; the in-process library, built for glibc, is never
loaded into one: a launch is refused before the program starts, an attach before anything is
called in it, each in one line that names musl. A CPython on musl is not walked (one line)."""

from __future__ import annotations

import shutil
import subprocess
import uuid

import pytest
from test_containers import PODMAN, RUN

from conftest import PROGRAMS
from helpers import attach_target_traced, fake_python_traced, final_report, run_command, sites

pytestmark = pytest.mark.usefixtures("cpu_hogs")
SITES = {"site_a": [(16, 10)], "site_b": [(16, 10)], "site_c": [(16, 10)], "site_d": [(16, 20)]}


@pytest.fixture(scope="module")
def musl(build_dir):
    def build(name: str):
        out = build_dir / f"{name}_musl"
        subprocess.run(["musl-gcc", "-O0", "-g", "-o", str(out), str(PROGRAMS / f"{name}.c")], check=True)
        return out

    return build


def test_the_bpf_engine_counts_a_musl_command_exactly(musl):
    report = final_report(run_command(["-c", str(musl("sites")), "--json", "3600"]))
    assert {name: sites(report).get(name) for name in SITES} == SITES


def attached_exactly(argv: list[str], library: str) -> None:
    """attach_target traced exactly, through library (the end of its path from here)."""
    pid_of = (lambda target: podman_pid(argv)) if argv[0] == "podman" else (lambda target: target.pid)
    _, start_line = attach_target_traced(argv, pid_of)
    assert f"{library} (musl):" in start_line, start_line


def podman_pid(argv: list[str]) -> int:
    """The host pid of the container that argv (podman run --name NAME ...) started."""
    name = argv[argv.index("--name") + 1]
    found = subprocess.run([*PODMAN, "inspect", "-f", "{{.State.Pid}}", name], capture_output=True, text=True)
    return int(found.stdout)


def test_the_bpf_engine_counts_an_attached_musl_process_exactly(musl):
    attached_exactly([str(musl("attach_target"))], "/usr/lib/x86_64-linux-musl/libc.so")


@pytest.fixture(scope="module")
def alpine_root(musl, tmp_path_factory):
    """A root laid out as Alpine's: its libc is its loader, lib/ld-musl-x86_64.so.1 (a copy of
    Debian's musl libc.so, not a link), and bin/attach_target names it as its interpreter."""
    root = tmp_path_factory.mktemp("alpine")
    (root / "lib").mkdir()
    (root / "bin").mkdir()
    shutil.copy("/usr/lib/x86_64-linux-musl/libc.so", root / "lib" / "ld-musl-x86_64.so.1")
    shutil.copy(musl("attach_target"), root / "bin" / "attach_target")
    return root


def test_the_bpf_engine_counts_a_process_in_an_alpine_root_exactly(alpine_root):
    attached_exactly(["chroot", str(alpine_root), "/bin/attach_target"], f"{alpine_root}/lib/ld-musl-x86_64.so.1")


def test_the_bpf_engine_counts_a_process_in_an_alpine_container_exactly(alpine_root):
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
        attached_exactly(argv, "/root/lib/ld-musl-x86_64.so.1")
    finally:
        subprocess.run([*PODMAN, "rm", "-f", "-t", "0", name], capture_output=True)
        subprocess.run([*PODMAN, "rmi", "-f", image], capture_output=True)


def test_the_in_process_engine_refuses_a_musl_command_before_it_starts(musl):
    """Loaded into a musl program, the glibc library stopped it from starting (exit 127)."""
    result = run_command(["-c", str(musl("sites")), "--engine", "preload", "3600"])
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "runs on musl (/lib/ld-musl-x86_64.so.1)" in line and "was not started" in line, line


def test_the_in_process_attach_refuses_a_musl_process_naming_it(musl):
    target = subprocess.Popen([str(musl("idle")), "30"])
    try:
        result = run_command(["-p", str(target.pid), "--engine", "preload", "1", "1"])
        assert result.returncode == 1 and "runs on musl" in result.stderr, result.stderr
        assert target.poll() is None
    finally:
        target.kill()
        target.wait()


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
