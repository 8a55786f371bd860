"""Size filters at their boundaries, and every loss counter driven for real."""

from __future__ import annotations

import pytest

from helpers import final_report, run_command, sites


def sized(program, *args: str, sizes: tuple[int, ...]) -> dict:
    command = " ".join([str(program("sizes")), *map(str, sizes)])
    return final_report(run_command(["-c", command, "--json", *args, "3600"]))


def with_stack(report: dict) -> list[int]:
    return sorted(g["size"] for g in report["groups"] if g["stack_status"] == "captured")


def filtered(report: dict) -> list[int]:
    return sorted(g["size"] for g in report["groups"] if g["stack_status"] == "filtered")


@pytest.mark.parametrize(
    "options,sizes,expect_stack",
    [
        ("backtrace backtrace_size=120", (119, 120, 121), [120]),
        ("backtrace backtrace_min_size=50 backtrace_max_size=1000", (49, 50, 1000, 1001), [50, 1000]),
        ("bt bt_min_sz=192 bt_max_sz=320", (191, 192, 193, 319, 320, 321), [192, 193, 319, 320]),
    ],
)
def test_size_filters_inclusive(program, options, sizes, expect_stack):
    report = sized(program, "--options", options, sizes=sizes)
    assert with_stack(report) == expect_stack
    assert filtered(report) == sorted(set(sizes) - set(expect_stack))
    # Filtered allocations are still counted, as malloc_debug does.
    assert report["live_allocations"] == len(sizes)
    assert report["live_bytes"] == sum(sizes)
    for group in report["groups"]:
        if group["stack_status"] == "captured":
            assert group["frames"][0]["function"] == "alloc_size"
        else:
            assert group["frames"] == []


def test_min_max_size_flags_same_as_options(program):
    report = sized(program, "--min-size", "192", "--max-size", "320", sizes=(191, 192, 320, 321))
    assert with_stack(report) == [192, 320]
    assert filtered(report) == [191, 321]


def test_backtrace_depth_limits_frames(program):
    report = sized(program, "--options", "backtrace=1", sizes=(10,))
    (group,) = report["groups"]
    assert [f["function"] for f in group["frames"]] == ["alloc_size"]
    report = sized(program, "--frames", "2", sizes=(10,))
    (group,) = report["groups"]
    assert [f["function"] for f in group["frames"]] == ["alloc_size", "main"]


def test_deepest_backtrace_is_kept_whole(program):
    """backtrace=256, the most malloc_debug allows, in the kernel too: 256 frames of a 300-deep stack."""
    report = final_report(run_command(["-c", f"{program('deep')} 300", "--json", "--frames", "256", "3600"]))
    (group,) = report["groups"]
    assert (group["size"], group["count"]) == (100, 1)
    assert [f["function"] for f in group["frames"]] == ["descend"] * 256


def site_report(program, *args: str) -> dict:
    return final_report(run_command(["-c", str(program("sites")), "--json", *args, "3600"]))


def test_sites_baseline(program):
    report = site_report(program)
    assert sites(report) == {"site_a": [(16, 10)], "site_b": [(16, 10)], "site_c": [(16, 10)], "site_d": [(16, 20)]}


def test_live_map_full_is_counted(program):
    report = site_report(program, "--max-live", "20")
    assert report["live_allocations"] == 20
    assert report["counters"]["live_map_full"] == 30 and report["complete"] is False
    assert sites(report) == {"site_a": [(16, 10)], "site_b": [(16, 10)]}
    assert site_report(program)["complete"] is True


def test_a_report_with_allocations_missing_says_so_first(program):
    """Dropped allocations make the figures low: the text report says so before the counters,
    never only "no live allocations"."""
    result = run_command(["-c", str(program("sites")), "--max-live", "20", "3600"])
    lines = result.stdout.splitlines()
    assert lines[1] == "INCOMPLETE: live figures are low (up to 30 allocations missing: live_map_full 30)"
    assert lines[2].startswith("drops: live_map_full 30, ")


def test_stack_map_full_is_counted(program):
    report = site_report(program, "--max-stacks", "2")
    assert report["counters"]["stack_map_full"] == 30
    assert sites(report) == {"site_a": [(16, 10)], "site_b": [(16, 10)], "(lost)": [(16, 30)]}
    assert report["live_allocations"] == 50


def test_site_map_full_is_counted(program):
    report = site_report(program, "--max-sites", "3")
    assert report["counters"]["site_map_full"] == 20
    assert sites(report) == {"site_a": [(16, 10)], "site_b": [(16, 10)], "site_c": [(16, 10)]}


def test_text_report_shows_lost_and_filtered(program):
    result = run_command(["-c", str(program("sites")), "--max-stacks", "2", "3600"])
    assert "(stack lost: see the drop counters)" in result.stdout
    assert "stack_map_full 30" in result.stdout
    command = f"{program('sizes')} 10 500"
    result = run_command(["-c", command, "--options", "backtrace_min_size=100", "3600"])
    assert "(no stack: size outside the backtrace size range)" in result.stdout
