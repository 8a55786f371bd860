"""The malloc_debug option parser against upstream's config test vectors."""

from __future__ import annotations

import pytest

from leaktrace.android.options import OptionError, check_engine_options, parse_malloc_debug_options
from leaktrace.platform.arch import HOST


@pytest.mark.parametrize(
    "text,frames",
    [
        ("backtrace", 16),
        ("bt=64", 64),
        ("backtrace  =10", 10),
        ("backtrace=  10", 10),
        ("   backtrace=64   ", 64),
        ("backtrace=1", 1),
        ("backtrace=256", 256),
        ("backtrace=+5", 5),
        ("backtrace=10 backtrace=20", 20),
        ("backtrace_enable_on_signal=7 backtrace=9", 9),
    ],
)
def test_frames(text, frames):
    assert parse_malloc_debug_options(text).backtrace_frames == frames


@pytest.mark.parametrize(
    "text,message",
    [
        ("unknown_option", "leaktrace: unknown option unknown_option"),
        ("backtrace unknown_option", "leaktrace: unknown option unknown_option"),
        ("backtrace=XXX", "leaktrace: bad value for option 'backtrace'"),
        ("backtrace=0", "leaktrace: bad value for option 'backtrace', value must be >= 1: 0"),
        (
            "backtrace=10front_guard",
            "leaktrace: bad value for option 'backtrace', non space found after option: front_guard",
        ),
        ("backtrace= front_guard", "leaktrace: bad value for option 'backtrace'"),
        ("backtrace=-1", "leaktrace: bad value for option 'backtrace', value cannot be negative: -1"),
        (
            "backtrace=99999999999999999999",
            "leaktrace: bad value for option 'backtrace': Numerical result out of range",
        ),
        ("leak_track=12", "leaktrace: value set for option 'leak_track' which does not take a value"),
        ("backtrace=300", "leaktrace: bad value for option 'backtrace', value must be <= 256: 300"),
        ("guard=20000", "leaktrace: bad value for option 'guard', value must be <= 16384: 20000"),
        ("backtrace_size", "leaktrace: bad value for option 'backtrace_size'"),
        ("backtrace_size=", "leaktrace: bad value for option 'backtrace_size'"),
        ("backtrace_size=0", "leaktrace: bad value for option 'backtrace_size', value must be >= 1: 0"),
        ("backtrace_min_size=-1", "leaktrace: bad value for option 'backtrace_min_size', value cannot be negative: -1"),
        ("bt_max_sz=0", "leaktrace: bad value for option 'bt_max_sz', value must be >= 1: 0"),
    ],
)
def test_upstream_error_texts(text, message):
    with pytest.raises(OptionError) as caught:
        parse_malloc_debug_options(text)
    assert str(caught.value) == message


def test_sizes_last_writer_wins():
    config = parse_malloc_debug_options("backtrace_size=37 backtrace_min_size=10")
    assert (config.backtrace_min_size, config.backtrace_max_size) == (10, 37)
    config = parse_malloc_debug_options("bt_min_sz=192 bt_max_sz=320")
    assert (config.backtrace_min_size, config.backtrace_max_size) == (192, 320)
    assert parse_malloc_debug_options("").backtrace_max_size == HOST.size_max
    assert parse_malloc_debug_options("backtrace_size=37").options == ("backtrace_size",)


def test_aliases_and_defaults():
    config = parse_malloc_debug_options("bt bt_dmp_on_ex bt_dmp_pre=/tmp/x guard front_guard=17 fill")
    assert config.options == (
        "backtrace",
        "backtrace_dump_on_exit",
        "backtrace_dump_prefix",
        "guard",
        "front_guard",
        "fill",
    )
    assert config.values["backtrace_dump_prefix"] == "/tmp/x"
    assert config.values["front_guard_bytes"] == 32  # 17 rounded up to 16-byte alignment
    assert config.values["rear_guard_bytes"] == 32
    assert config.values["fill_on_free_bytes"] == HOST.size_max
    assert parse_malloc_debug_options("bt_dmp_pre").values["backtrace_dump_prefix"] == "/data/local/tmp/backtrace_heap"


@pytest.mark.parametrize(
    "text,reason",
    [
        ("guard", "works only inside the allocator"),
        ("free_track=5", "works only inside the allocator"),
        ("check_unreachable_on_signal", "not supported by the BPF engine"),
    ],
)
def test_bpf_engine_refuses(text, reason):
    with pytest.raises(OptionError, match=reason):
        check_engine_options(parse_malloc_debug_options(text))


def test_bpf_engine_accepts_backtrace_options():
    check_engine_options(
        parse_malloc_debug_options(
            "bt=8 bt_sz=24 backtrace_min_size=1 leak_track bt_full bt_dmp_on_ex bt_dmp_pre=/tmp/d"
        )
    )
