"""Services in containers, traced from the host with a real runtime: podman (with runc: this
machine's cgroups are hybrid v1, which crun refuses) running an image imported from the
Debian 13 root, under podman's default seccomp profile, in its own mount and pid namespaces
and cgroup. Both engines attach with -p and count exactly, the container runs on, and every
output names the container; --all --container traces only its processes; the agent's
default (in-process, sampled) serves /metrics with the container's id."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from test_exact_counts import SHAPES, SHAPES_BYTES, SHAPES_COUNT, assert_shapes

from conftest import leaktrace_command
from helpers import TIMEOUT, final_report, free_port, reports, sites, wait_for_line, wait_for_start

pytestmark = pytest.mark.usefixtures("cpu_hogs")

PODMAN = ["podman", "--runtime", "runc"]
IMAGE = "leaktrace-test:trixie"
DEBIAN13 = Path(__file__).parents[2] / "build" / "debian13"  # setup.sh --tests makes it
# This machine's podman: setting the default rlimits is refused, and there is no network.
RUN = ["run", "--rm", "-i", "--network", "none", "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]


@pytest.fixture(scope="module")
def image() -> str:
    """The test image, imported from the Debian 13 root once (no registry is reached)."""
    if subprocess.run([*PODMAN, "image", "exists", IMAGE]).returncode != 0:
        tar = subprocess.Popen(["tar", "-C", str(DEBIAN13), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run([*PODMAN, "import", "-", IMAGE], stdin=tar.stdout, capture_output=True, timeout=600)
        tar.wait()
        assert imported.returncode == 0, imported.stderr
    return IMAGE


class Container:
    """A container running a program of the build directory (mounted at /fixture), its stdin and
    stdout ours; its id and its first process's pid as the host sees them."""

    def __init__(self, image: str, build_dir: Path, *argv: str, options: tuple[str, ...] = ()):
        self.name = f"leaktrace-test-{uuid.uuid4().hex[:12]}"
        self.process = subprocess.Popen(
            [*PODMAN, *RUN, *options, "--name", self.name, "-v", f"{build_dir}:/fixture:ro", image, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def started(self) -> Container:
        """Its id and pid, once podman has started it (within 60 s)."""
        for _ in range(600):
            inspect = subprocess.run(
                [*PODMAN, "inspect", "-f", "{{.Id}} {{.State.Pid}}", self.name], capture_output=True, text=True
            )
            words = inspect.stdout.split()
            if len(words) == 2 and words[1] != "0":
                self.id, self.pid = words[0], int(words[1])
                return self
            time.sleep(0.1)
        raise AssertionError(f"container {self.name} did not start: {inspect.stderr}")

    def running(self) -> bool:
        found = subprocess.run([*PODMAN, "ps", "-q", "--no-trunc", "-f", f"name={self.name}"], capture_output=True)
        return self.process.poll() is None and found.stdout.decode().strip() == self.id

    def send(self, data: bytes) -> None:
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def close(self) -> None:
        subprocess.run([*PODMAN, "rm", "-f", "-t", "0", self.name], capture_output=True)
        self.process.wait(timeout=60)


def traced_shapes(container: Container, argv: list[str], stop) -> dict:
    """`shapes wait` in container traced by argv from the moment it says it is live: shapes
    allocates, the trace is stopped (stop(tracer)), and its final report, every site exact."""
    tracer = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = wait_for_start(tracer.stderr)
        if "probes live" not in line and "attached in-process" not in line:
            tracer.kill()
            raise AssertionError(line + tracer.stderr.read())
        container.send(b"x")
        assert wait_for_line(container.process.stdout) == b"done\n"
        stop(tracer)
        out, err = tracer.communicate(timeout=TIMEOUT)
    finally:
        if tracer.poll() is None:
            tracer.kill()
    report = final_report(subprocess.CompletedProcess([], tracer.returncode, out, err))
    assert_shapes(report)
    return report


@pytest.mark.parametrize("engine", ["bpf", "preload"])
def test_both_engines_attach_to_a_container_exactly_and_name_it(image, program, build_dir, engine):
    """shapes in a container under podman's default seccomp profile: -p from the host, every
    site exact, the container still running after the trace, and its id in the JSON, the text
    report's process line and the pprof labels."""
    container = Container(image, build_dir, f"/fixture/{program('shapes').name}", "wait")
    try:
        assert wait_for_line(container.process.stdout) == b"ready\n"
        container.started()
        status = Path(f"/proc/{container.pid}/status").read_text()
        assert "Seccomp:\t2" in status, status  # podman's default profile is on
        pprof = ["--pprof", str(build_dir / f"container-{engine}.pb.gz")]
        argv = leaktrace_command("-p", str(container.pid), "--engine", engine, "--json", "3600", *pprof)
        report = traced_shapes(container, argv, lambda tracer: tracer.send_signal(signal.SIGINT))
        [process] = report["processes"]
        assert process["container"] == {"id": container.id, "runtime": "podman", "pod_uid": ""}
        assert container.running()
        labels = subprocess.run(
            ["go", "tool", "pprof", "-raw", str(build_dir / f"container-{engine}.pb.gz")],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
        assert f"container_id:[{container.id}]" in labels, labels[-800:]
    finally:
        container.close()


def test_the_text_report_names_the_container(image, program, build_dir):
    container = Container(image, build_dir, f"/fixture/{program('shapes').name}", "wait")
    try:
        assert wait_for_line(container.process.stdout) == b"ready\n"
        container.started()
        result = subprocess.run(
            leaktrace_command("-p", str(container.pid), "1", "1"), capture_output=True, text=True, timeout=TIMEOUT
        )
        assert result.returncode == 0, result.stderr
        assert f"pid {container.pid} (shapes, podman {container.id[:12]})" in result.stdout, result.stdout
    finally:
        container.close()


def test_all_with_container_traces_only_that_containers_processes(image, program, build_dir):
    """--all --container ID: a program podman exec starts in the container after the trace began
    is traced from its start, exactly; the same program run on the host meanwhile is not."""
    shapes = program("shapes")
    container = Container(image, build_dir, "sleep", "3600").started()
    try:
        tracer = subprocess.Popen(
            leaktrace_command("--all", "--container", container.id[:10], "--json", "3600"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        first = wait_for_start(tracer.stderr)
        assert f"podman container {container.id[:12]}" in first, first
        assert "probes live" in wait_for_line(tracer.stderr)
        assert subprocess.run([str(shapes)], timeout=60).returncode == 0
        inside = subprocess.run([*PODMAN, "exec", container.name, f"/fixture/{shapes.name}"], timeout=120)
        assert inside.returncode == 0
        tracer.send_signal(signal.SIGINT)
        out, err = tracer.communicate(timeout=TIMEOUT)
        assert tracer.returncode == 0, err
        final = reports(out)[-1]
        assert [(p["comm"], p["container"]["id"]) for p in final["processes"]] == [("shapes", container.id)]
        # Exact per site; the counters also count runc's own calls as it started shapes (its Go
        # code has no unwind rules: stacks_truncated), which are this container's too.
        assert {name: sites(final).get(name) for name in SHAPES} == SHAPES
        assert (final["live_bytes"], final["live_allocations"]) == (SHAPES_BYTES, SHAPES_COUNT)
    finally:
        container.close()


def test_container_options_are_refused_in_one_line(image, program, build_dir):
    for words, message in [
        (["-p", "1", "--container", "abc"], "--container needs --all"),
        (["--all", "--container", "xyz!"], "is not a container id"),
        (["--all", "--container", "0123456789abcdef0"], "no running container has an id that begins with"),
    ]:
        result = subprocess.run(leaktrace_command(*words, "1", "1"), capture_output=True, text=True, timeout=TIMEOUT)
        assert result.returncode in (1, 2) and message in result.stderr and "Traceback" not in result.stderr, (
            words,
            result.stderr,
        )
    container = Container(image, build_dir, "/bin/sh", "-c", "read line", options=("--pid", "host")).started()
    try:
        result = subprocess.run(
            leaktrace_command("--all", "--container", container.id[:12], "1", "1"),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert result.returncode == 1 and "shares the host's pid namespace" in result.stderr, result.stderr
    finally:
        container.close()


def test_the_agents_default_serves_a_containers_heap_labelled(image, program, build_dir):
    """leaktrace agent -p PID with its defaults (in-process, sampled at 512 KiB) on a process in a
    container: attached under podman's seccomp profile, /metrics carries its container_id."""
    container = Container(image, build_dir, f"/fixture/{program('attach_target').name}")
    port = free_port()
    agent = None
    try:
        assert wait_for_line(container.process.stdout) == b"ready\n"
        container.started()
        agent = subprocess.Popen(
            leaktrace_command("agent", "-p", str(container.pid), "--listen", f"127.0.0.1:{port}", "0.3"),
            stderr=subprocess.PIPE,
            text=True,
        )
        while "serving http://" not in (line := wait_for_line(agent.stderr)):
            assert "cannot" not in line, line
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
            metrics = response.read().decode()
        assert f'container_id="{container.id}"' in metrics, metrics[:2000]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=30) as response:
            status = json.loads(response.read())
        assert status["processes"][0]["container"]["id"] == container.id
        agent.send_signal(signal.SIGINT)
        _, err = agent.communicate(timeout=60)
        assert agent.returncode == 0 and "Traceback" not in err, err
        assert container.running()
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
        container.close()


# The node agent's container (docs/agent.md): the host's pid namespace, these capabilities and
# no seccomp or AppArmor profile of its own, tracefs, bpffs and the kernel headers bcc compiles with.
AGENT_CONTAINER = [
    "--pid",
    "host",
    "--cap-drop",
    "all",
    "--cap-add",
    "BPF,PERFMON,SYS_PTRACE,SYS_ADMIN,SETUID,SETGID,DAC_READ_SEARCH,KILL,SYS_RESOURCE",
    "--security-opt",
    "seccomp=unconfined",
    "--security-opt",
    "apparmor=unconfined",
    *("-v", "/sys/kernel/tracing:/sys/kernel/tracing", "-v", "/sys/fs/bpf:/sys/fs/bpf"),
    *("-v", "/lib/modules:/lib/modules:ro", "-v", "/usr/src:/usr/src:ro"),
]


@pytest.fixture(scope="module")
def leaktrace_image() -> str:
    """localhost/leaktrace:latest, built from this checkout by scripts/container_image.sh."""
    built = subprocess.run(
        ["bash", str(Path(__file__).parents[2] / "scripts" / "container_image.sh")],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    return "localhost/leaktrace:latest"


@pytest.mark.parametrize("engine", ["bpf", "preload"])
def test_leaktraces_own_image_traces_a_service_in_another_container(image, leaktrace_image, program, build_dir, engine):
    """leaktrace's image, run with the documented capabilities (not --privileged), traces shapes
    in another container by its host pid: every site exact, both containers running on."""
    service = Container(image, build_dir, f"/fixture/{program('shapes').name}", "wait")
    try:
        assert wait_for_line(service.process.stdout) == b"ready\n"
        service.started()
        name = f"leaktrace-agent-{uuid.uuid4().hex[:12]}"
        argv = [*PODMAN, *RUN, "--name", name, *AGENT_CONTAINER, leaktrace_image]
        argv += ["-p", str(service.pid), "--engine", engine, "--json", "3600"]
        report = traced_shapes(
            service,
            argv,
            lambda _: subprocess.run([*PODMAN, "kill", "--signal", "INT", name], check=True, capture_output=True),
        )
        assert report["processes"][0]["container"]["id"] == service.id
        assert service.running()
    finally:
        service.close()
