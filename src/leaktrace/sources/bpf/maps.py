"""Reading whole BPF maps fast (BPF_MAP_LOOKUP_BATCH into raw buffers), and the flags of single updates."""

from __future__ import annotations

import ctypes as ct
import errno
import functools
import gc

from bcc.libbcc import lib

BPF_NOEXIST, BPF_EXIST = 1, 2  # bpf_update_elem: only a new element; only one that is there
CHUNK = 4096  # entries asked for per BPF_MAP_LOOKUP_BATCH: memory follows what the map holds, not its size
_scratches: dict[tuple[int, int], ct.Array] = {}


def _scratch(size: int, which: int) -> ct.Array:
    """A buffer of size bytes for a batch read, made once and reused (reads are made by one
    thread at a time; which: 0 for keys, 1 for values, which may be of one size)."""
    key = (size, which)
    if key not in _scratches:
        _scratches[key] = ct.create_string_buffer(size)
    return _scratches[key]


def dump_map(table) -> tuple[bytes, bytes, int]:
    """All (keys, values) of a hash map as two packed byte strings and a count.

    Uses batch lookup where the kernel has it (one syscall per CHUNK entries), else walks
    the keys one by one.
    """
    key_size, value_size = ct.sizeof(table.Key), ct.sizeof(table.Leaf)
    chunk = min(CHUNK, table.max_entries)
    keys, values = bytearray(), bytearray()
    key_buffer, value_buffer = _scratch(key_size * chunk, 0), _scratch(value_size * chunk, 1)
    token_in, token_out = ct.c_uint32(0), ct.c_uint32(0)
    count = ct.c_uint32(0)
    total, first = 0, True
    while True:
        count.value = chunk
        res = lib.bpf_lookup_batch(
            table.map_fd,
            None if first else ct.byref(token_in),
            ct.byref(token_out),
            key_buffer,
            value_buffer,
            ct.byref(count),
        )
        err = ct.get_errno()
        keys += ct.string_at(key_buffer, key_size * count.value)
        values += ct.string_at(value_buffer, value_size * count.value)
        total += count.value
        if res != 0:
            if err == errno.ENOENT:
                break
            if err == errno.ENOSPC and count.value == 0:  # a hash bucket holds more than a chunk
                chunk *= 2
                key_buffer, value_buffer = _scratch(key_size * chunk, 0), _scratch(value_size * chunk, 1)
                continue
            if err in (errno.EINVAL, errno.ENOTSUP, 524) and first:  # 524: ENOTSUPP
                return _walk_map(table)
            raise OSError(err, f"BPF_MAP_LOOKUP_BATCH: {errno.errorcode.get(err, err)}")
        first = False
        token_in.value = token_out.value
    return bytes(keys), bytes(values), total


def _walk_map(table) -> tuple[bytes, bytes, int]:
    key_parts, value_parts = [], []
    for key, value in table.items():
        key_parts.append(bytes(key))
        value_parts.append(bytes(value))
    return b"".join(key_parts), b"".join(value_parts), len(key_parts)


def gc_paused(method):
    """Runs a whole-map walk with the cyclic GC off: its millions of fresh tuples would
    trigger collection after collection (a 1M-entry walk takes half the time without)."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return method(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()

    return wrapper


def update_array(table, first: int, values: bytes, count: int) -> None:
    """Writes count packed values into an array map from index first on: one BPF_MAP_UPDATE_BATCH."""
    keys = (ct.c_uint32 * count)(*range(first, first + count))
    buffer = ct.create_string_buffer(values, len(values))
    done = ct.c_uint32(count)
    if lib.bpf_update_batch(table.map_fd, keys, buffer, ct.byref(done)) != 0:
        err = ct.get_errno()
        raise OSError(err, f"BPF_MAP_UPDATE_BATCH: {errno.errorcode.get(err, err)}")


def delete_keys(table, keys: bytes) -> None:
    """Deletes packed keys from a hash map: BPF_MAP_DELETE_BATCH; a key already gone (a race
    with the BPF program) is passed over."""
    key_size = ct.sizeof(table.Key)
    at, count = 0, len(keys) // key_size
    base = ct.cast(ct.c_char_p(keys), ct.c_void_p).value or 0  # the bytes' own buffer: the kernel only reads it
    while at < count:
        done = ct.c_uint32(count - at)
        if lib.bpf_delete_batch(table.map_fd, ct.c_void_p(base + at * key_size), ct.byref(done)) == 0:
            return
        err = ct.get_errno()
        if err != errno.ENOENT:
            raise OSError(err, f"BPF_MAP_DELETE_BATCH: {errno.errorcode.get(err, err)}")
        at += done.value + 1  # the key that was not there
