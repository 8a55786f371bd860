"""MapsFollower: the executable mappings of a process from read to read, and those dlclose'd."""

from leaktrace.platform.process import MapsFollower

PROGRAM = "555555554000-555555555000 r-xp 00001000 fd:01 11 /usr/bin/prog"
LIBC = "7ffff7dab000-7ffff7f00000 r-xp 00026000 fd:01 22 /usr/lib/libc.so.6"
HEAP = "555555559000-55555557a000 rw-p 00000000 00:00 0 [heap]"
PLUGIN = "7ffff7fb0000-7ffff7fb1000 r-xp 00001000 fd:01 33 /tmp/plugin.so"
DATA_OVER_PLUGIN = "7ffff7fb0000-7ffff7fb2000 rw-p 00000000 00:00 0"


def test_executable_mappings_in_address_order_and_versions_change_only_with_them():
    maps = MapsFollower()
    maps.follow("\n".join([LIBC, HEAP, PROGRAM]))
    assert [m.path for m in maps.executable] == ["/usr/bin/prog", "/usr/lib/libc.so.6"]
    version = maps.version
    maps.follow("\n".join([PROGRAM, LIBC]))  # only a data mapping went
    assert maps.version == version
    maps.follow("\n".join([PROGRAM, PLUGIN, LIBC]))
    assert maps.version != version and len(maps.executable) == 3


def test_a_dlclosed_library_stays_until_its_range_is_mapped_again():
    maps = MapsFollower()
    maps.follow("\n".join([PROGRAM, LIBC, PLUGIN]))
    assert maps.unmapped == ""
    maps.follow("\n".join([PROGRAM, LIBC]))
    assert maps.unmapped == PLUGIN and len(maps.executable) == 2
    maps.follow("\n".join([PROGRAM, HEAP, LIBC]))  # unrelated change: still unmapped
    assert maps.unmapped == PLUGIN
    maps.follow("\n".join([PROGRAM, HEAP, LIBC, DATA_OVER_PLUGIN]))
    assert maps.unmapped == ""


def test_another_image_forgets_the_last_ones_mappings():
    maps = MapsFollower()
    maps.follow("\n".join([PROGRAM, LIBC, PLUGIN]))
    maps.follow("\n".join([PROGRAM, LIBC]))
    other = "400000-401000 r-xp 00000000 fd:01 44 /usr/bin/other"
    maps.follow(other)
    assert maps.unmapped == "" and [m.path for m in maps.executable] == ["/usr/bin/other"]
