"""Who is on the other end of a connection to the agent, and what of the traced processes it
may see. A TCP peer on this machine is known by the uid that owns its socket, which the
kernel lists in /proc/net/tcp and tcp6 beside the socket's two addresses (as identd
answers); SO_PEERCRED applies to Unix sockets only. A remote peer is known by its address."""

from __future__ import annotations

import argparse
import ipaddress
import socket
import struct
from dataclasses import dataclass

from leaktrace.model.snapshot import ProcessInfo

SOCKET_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
TABLE_READ_LIMIT = 64 << 20  # bytes of a socket table read at the most


@dataclass(frozen=True)
class Peer:
    address: str  # the peer's IP address ("" on a Unix socket)
    uid: int | None  # the owner of its socket, for a peer on this machine whose socket was found

    @property
    def key(self) -> tuple:
        """What one peer's connections are counted under: a local user, or a remote address."""
        return ("uid", self.uid) if self.uid is not None else ("address", self.address)

    def allowed_by(self, networks: tuple) -> bool:
        try:
            address = ipaddress.ip_address(self.address)
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped
        return any(address in network for network in networks)


@dataclass(frozen=True)
class Visibility:
    """Whose processes a peer may see: everyone's (all), one uid's, or nobody's."""

    all: bool = False
    uid: int | None = None

    @classmethod
    def everything(cls) -> Visibility:
        return cls(all=True)

    @classmethod
    def of_uid(cls, uid: int) -> Visibility:
        return cls(uid=uid)

    @classmethod
    def nothing(cls) -> Visibility:
        return cls()

    def shows(self, info: ProcessInfo | None) -> bool:
        if self.all:
            return True
        return info is not None and self.uid is not None and info.credentials.uid == self.uid


def allowed_network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """--listen-allow's value: an address or a network (CIDR)."""
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an address or network (such as 10.0.0.0/8)") from None


def _table_form(address: tuple[str, int]) -> tuple[str, ...]:
    """The ways /proc/net/tcp and tcp6 write (address, port): the address in 32-bit words of
    the kernel's byte order, in hexadecimal (an IPv4 address also as an IPv4-mapped one)."""
    host, port = _plain(address[0]), address[1]

    def words(packed: bytes) -> str:
        return "".join(f"{word:08X}" for word in struct.unpack(f"<{len(packed) // 4}I", packed))

    if ":" in host:
        return (f"{words(socket.inet_pton(socket.AF_INET6, host))}:{port:04X}",)
    v4 = socket.inet_pton(socket.AF_INET, host)
    mapped = bytes(10) + b"\xff\xff" + v4
    return f"{words(v4)}:{port:04X}", f"{words(mapped)}:{port:04X}"


def _plain(address: str) -> str:
    """An IPv4 address seen through an IPv6 socket, as IPv4."""
    return address[len("::ffff:") :] if address.startswith("::ffff:") and "." in address else address


def socket_owner(peer: tuple[str, int], ours: tuple[str, int]) -> int | None:
    """The uid owning the socket at peer connected to ours, if it is on this machine."""
    peers, locals_ = set(_table_form(peer)), set(_table_form(ours))
    for table in SOCKET_TABLES:
        try:
            with open(table) as f:
                lines = f.read(TABLE_READ_LIMIT).splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split(maxsplit=8)
            if len(fields) > 7 and fields[1] in peers and fields[2] in locals_:
                return int(fields[7])
    return None


def peer_of(connection: socket.socket, client_address) -> Peer:
    """The peer of an accepted connection."""
    if connection.family == socket.AF_UNIX:
        return Peer("", None)
    address = (str(client_address[0]), int(client_address[1]))
    local = ipaddress.ip_address(_plain(address[0])).is_loopback
    return Peer(address[0], socket_owner(address, connection.getsockname()[:2]) if local else None)
