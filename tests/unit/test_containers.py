"""Which container a process runs in, from its cgroup paths (platform/containers.py): each
runtime's conventions in cgroup v1 and v2, pods, monitors that are not in the container, and
names that only look like ids."""

from __future__ import annotations

import pytest

from leaktrace.model.snapshot import Container, ProcessInfo
from leaktrace.platform.containers import container_in_cgroups, container_in_path

ID = "bc24c1f6ad5d7ce5155da98907826930bc347c48cdce09fc193b7af37d18e470"
POD = "3f1c2a9e-7b4d-4e21-9c8a-0d5e6f7a8b9c"


@pytest.mark.parametrize(
    "path, found",
    [
        (f"/libpod_parent/libpod-{ID}", Container(ID, "podman")),  # podman with cgroupfs (this machine)
        (f"/machine.slice/libpod-{ID}.scope", Container(ID, "podman")),
        (
            f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container",
            Container(ID, "podman"),
        ),
        (f"/machine.slice/libpod-conmon-{ID}.scope", None),  # podman's monitor, outside the container
        (f"/system.slice/docker-{ID}.scope", Container(ID, "docker")),
        (f"/docker/{ID}", Container(ID, "docker")),
        (
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            + POD.replace("-", "_")
            + f".slice/cri-containerd-{ID}.scope",
            Container(ID, "containerd", POD),
        ),
        (f"/kubepods/burstable/pod{POD}/{ID}", Container(ID, "containerd", POD)),
        (
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
            + POD.replace("-", "_")
            + f".slice/crio-{ID}.scope",
            Container(ID, "cri-o", POD),
        ),
        (f"/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/crio-conmon-{ID}.scope", None),
        ("/user.slice/user-0.slice/session-1.scope", None),
        (f"/libpod-{ID[:63]}", None),  # not an id of the runtimes' form
        (f"/docker-{ID}.scope\x1b[31m", None),  # nothing but the id's own characters is taken
        (f"/docker-{ID.upper()}.scope", None),
    ],
)
def test_each_runtimes_paths(path, found):
    assert container_in_path(path) == found


def test_the_unified_hierarchy_first_then_any_v1_hierarchy():
    other = "f" * 64
    text = f"12:pids:/docker/{other}\n0::/system.slice/docker-{ID}.scope\n"
    assert container_in_cgroups(text) == Container(ID, "docker")
    assert container_in_cgroups(f"9:name=systemd:/libpod_parent/libpod-{ID}\n0::/\n") == Container(ID, "podman")
    assert container_in_cgroups("0::/init.scope\n") is None
    assert container_in_cgroups("garbage\n\n:::\n") is None


def test_a_process_label_names_its_container():
    assert ProcessInfo(7, "worker").label == "7 (worker)"
    assert ProcessInfo(7, "worker", container=Container(ID, "podman")).label == "7 (worker, podman bc24c1f6ad5d)"
