"""Which container a process runs in, read from the kernel's /proc/PID/cgroup alone (no
runtime's client or socket): the runtimes' path conventions in cgroup v1 and v2. A cgroup
path is a name a user can choose for cgroups of their own, so what is found here is a label
for the reader, never a reason to decide anything; only ids of the runtimes' form are taken,
so a label holds nothing but hex digits, dashes and the runtime's name."""

from __future__ import annotations

import os
import re

from leaktrace.errors import RuntimeFailure
from leaktrace.model.snapshot import Container

CGROUP_READ_LIMIT = 64 << 10  # bytes of /proc/PID/cgroup read
ID_PREFIX = re.compile(r"[0-9a-f]{1,64}")  # what --container takes: the start of an id, as podman ps prints it
_ID = r"([0-9a-f]{64})"
# (runtime, pattern) for one path component, most specific first: a runtime's monitor process
# (conmon) is not in the container.
_COMPONENTS = (
    ("podman", re.compile(rf"^libpod-{_ID}(?:\.scope)?$")),
    ("docker", re.compile(rf"^docker-{_ID}\.scope$")),
    ("containerd", re.compile(rf"^cri-containerd-{_ID}\.scope$")),
    ("cri-o", re.compile(rf"^crio-{_ID}\.scope$")),
)
_DOCKER_DIRECTORY = re.compile(rf"/docker/{_ID}(?:/|$)")  # cgroupfs driver: /docker/<id>
_KUBEPODS_ID = re.compile(rf"/kubepods[^/]*(?:/[^/]+)*?/pod[0-9a-f_-]+/{_ID}(?:/|$)")  # cgroupfs driver
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?(?:/|$)")


def container_in_path(path: str) -> Container | None:
    """The container one cgroup path names, or None."""
    pod = _POD.search(path)
    pod_uid = pod.group(1).replace("_", "-") if pod else ""
    for component in reversed(path.split("/")):
        for runtime, pattern in _COMPONENTS:
            found = pattern.match(component)
            if found:
                return Container(found.group(1), runtime, pod_uid)
    found = _KUBEPODS_ID.search(path)
    if found:
        return Container(found.group(1), "containerd" if pod_uid else "docker", pod_uid)
    found = _DOCKER_DIRECTORY.search(path)
    return Container(found.group(1), "docker") if found else None


def container_in_cgroups(text: str) -> Container | None:
    """The container /proc/PID/cgroup's lines (hierarchy:controllers:path) name: the unified
    hierarchy's (0::) first, then any v1 hierarchy's."""
    entries = [line.split(":", 2) for line in text.splitlines() if line.count(":") >= 2]
    ordered = [path for hierarchy, _, path in entries if hierarchy == "0"]
    for path in ordered + [path for hierarchy, _, path in entries if hierarchy != "0"]:
        found = container_in_path(path)
        if found:
            return found
    return None


def container_of(pid: int) -> Container | None:
    """The container pid runs in, None outside any (or once it has gone)."""
    try:
        fd = os.open(f"/proc/{pid}/cgroup", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return container_in_cgroups(os.read(fd, CGROUP_READ_LIMIT).decode(errors="replace"))
    except OSError:
        return None
    finally:
        os.close(fd)


def container_pid_namespace(prefix: str) -> tuple[Container, tuple[int, int]]:
    """The one running container whose id begins with prefix and its pid namespace (its nsfs
    file's device and inode); RuntimeFailure where there is none, or where the container shares
    leaktrace's own pid namespace (--pid host), whose processes the kernel cannot tell apart by it."""
    container, pids = find_container(prefix)
    ours = os.stat("/proc/self/ns/pid")
    for pid in pids:
        try:
            found = os.stat(f"/proc/{pid}/ns/pid")
        except OSError:
            continue
        if (found.st_dev, found.st_ino) == (ours.st_dev, ours.st_ino):
            raise RuntimeFailure(
                f"container {container.short_id} shares the host's pid namespace (--pid host): the kernel cannot "
                "tell its processes from the others' by it; trace them with -p, or --all --comm"
            )
        return container, (found.st_dev, found.st_ino)
    raise RuntimeFailure(f"container {container.short_id} has no process left")


def find_container(prefix: str) -> tuple[Container, list[int]]:
    """The one running container whose id begins with prefix, and its processes; RuntimeFailure
    when none does, or several."""
    if not ID_PREFIX.fullmatch(prefix):
        raise RuntimeFailure(f"'{prefix[:80]}' is not a container id (hex digits, as podman ps or docker ps print)")
    found: dict[str, tuple[Container, list[int]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            container = container_of(int(entry))
            if container is not None and container.id.startswith(prefix):
                found.setdefault(container.id, (container, []))[1].append(int(entry))
    if not found:
        raise RuntimeFailure(f"no running container has an id that begins with {prefix}")
    if len(found) > 1:
        names = ", ".join(found_id[:12] for found_id in sorted(found))
        raise RuntimeFailure(f"{prefix} begins the ids of {len(found)} containers: {names}")
    [(container, pids)] = found.values()
    return container, sorted(pids)
