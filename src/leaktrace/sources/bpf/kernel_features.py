"""What the running kernel offers the BPF engine, each feature with the release that brought it
upstream and what the engine does without it: one table, read by the engine, its start-up line
and `leaktrace features`. A stock distribution kernel is upstream's release (Debian 5.10, 6.1,
6.12); a kernel that backports a feature (RHEL's) is taken at its version's word, never beyond."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from leaktrace.errors import RuntimeFailure
from leaktrace.sources.settings import EngineSettings


@dataclass(frozen=True)
class KernelFeature:
    name: str
    since: tuple[int, int]  # the upstream release that brought it
    without: str  # what the engine does on a kernel without it ("" : it cannot run)

    @property
    def since_text(self) -> str:
        return f"Linux {self.since[0]}.{self.since[1]}"


BTF = KernelFeature("btf", (5, 4), "")  # /sys/kernel/btf/vmlinux, checked on its own
RINGBUF = KernelFeature("ringbuf", (5, 8), "")
TASK_STORAGE = KernelFeature(
    "task_storage",
    (5, 11),
    f"each thread's call in a hash by thread id: a lookup more a call, {EngineSettings.max_threads:,} threads at most",
)
PERF_LINK_COOKIE = KernelFeature(
    "perf_link_cookie", (5, 15), "each probe runs a stub that hands its cookie on: a tail call more a call"
)
UPROBE_MULTI = KernelFeature(
    "uprobe_multi", (6, 6), "each probe attached alone through a perf event; detach waits once per probe"
)
UPROBE_SESSION = KernelFeature("uprobe_session", (6, 13), "sampled calls probed at entry and return")
FEATURES = (BTF, RINGBUF, TASK_STORAGE, PERF_LINK_COOKIE, UPROBE_MULTI, UPROBE_SESSION)


def kernel_release() -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def turned_off() -> set[str]:
    """The features LEAKTRACE_FEATURES_OFF (comma-separated names) says to do without, as on an
    older kernel: how the fallbacks are tested on a kernel that has it all."""
    return {name.strip() for name in os.environ.get("LEAKTRACE_FEATURES_OFF", "").split(",") if name.strip()}


def offers(feature: KernelFeature) -> bool:
    if feature.name in turned_off() and feature.without:
        return False
    if feature is BTF:
        return os.path.exists("/sys/kernel/btf/vmlinux")
    return kernel_release() >= feature.since


def missing_required() -> list[KernelFeature]:
    """The features the engine cannot run without that this kernel lacks."""
    return [feature for feature in FEATURES if not feature.without and not offers(feature)]


def check_kernel() -> None:
    """RuntimeFailure in one line naming what this kernel lacks that the BPF engine needs."""
    missing = missing_required()
    if missing:
        lacks = ", ".join(f"{feature.name} ({feature.since_text})" for feature in missing)
        raise RuntimeFailure(
            f"Linux {os.uname().release} lacks what the BPF engine needs: {lacks}; --engine preload traces "
            "a command or process without it (leaktrace features lists them all)"
        )


def features_off(sampling: bool = True) -> list[str]:
    """A line's worth for each feature off here that the engine does without, and what it costs
    (uprobe sessions serve sampling only)."""
    return [
        f"no {feature.name} ({feature.since_text}): {feature.without}"
        for feature in FEATURES
        if feature.without and not offers(feature) and (sampling or feature is not UPROBE_SESSION)
    ]


def feature_table() -> str:
    """Every feature: on or off here, the release that brings it, and its cost when off."""
    lines = [
        f"kernel {os.uname().release} ({os.uname().machine})",
        f"{'feature':<18} {'here':<5} {'since':<11} without it",
    ]
    for feature in FEATURES:
        cost = feature.without or "the BPF engine cannot run (--engine preload can)"
        lines.append(f"{feature.name:<18} {'on' if offers(feature) else 'off':<5} {feature.since_text:<11} {cost}")
    return "\n".join(lines) + "\n"
