"""Who is on the other end of an agent connection: a loopback TCP peer is known by the uid
that owns its socket (found in /proc/net/tcp and tcp6, in the kernel's byte order), a
remote one by its address, checked against --listen-allow; and what each may see."""

from __future__ import annotations

import argparse
import os
import socket

import pytest

from leaktrace.model.snapshot import Credentials, ProcessInfo
from leaktrace.platform.peers import Peer, Visibility, allowed_network, peer_of, socket_owner


def connected(family: int, host: str) -> tuple[socket.socket, socket.socket, socket.socket]:
    """A listener, a client connected to it, and the accepted end."""
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.bind((host, 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname()[:2])
    accepted, _ = listener.accept()
    return listener, client, accepted


@pytest.mark.parametrize("family, host", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_a_loopback_peer_is_known_by_the_uid_owning_its_socket(family, host):
    try:
        sockets = connected(family, host)
    except OSError as e:  # a kernel without IPv6 on loopback
        pytest.fail(f"cannot connect on {host}: {e}")
    listener, client, accepted = sockets
    try:
        peer = client.getsockname()[:2]
        assert socket_owner(peer, listener.getsockname()[:2]) == os.getuid()
        found = peer_of(accepted, accepted.getpeername())
        assert found.uid == os.getuid() and found.key == ("uid", os.getuid())
        # A socket that is not connected to ours owns nothing here.
        assert socket_owner(peer, (host, 1)) is None
    finally:
        for s in sockets:
            s.close()


def test_an_ipv4_peer_through_an_ipv6_listener_is_found_too():
    listener = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    listener.bind(("::", 0))
    listener.listen(1)
    client = socket.create_connection(("127.0.0.1", listener.getsockname()[1]))
    accepted, address = listener.accept()
    try:
        assert address[0] == "::ffff:127.0.0.1"
        assert peer_of(accepted, address).uid == os.getuid()
    finally:
        for s in (listener, client, accepted):
            s.close()


def test_allowed_networks_match_plain_and_ipv4_mapped_addresses():
    networks = (allowed_network("10.0.0.0/8"), allowed_network("2001:db8::/32"))
    assert Peer("10.1.2.3", None).allowed_by(networks)
    assert Peer("::ffff:10.1.2.3", None).allowed_by(networks)
    assert Peer("2001:db8::1", None).allowed_by(networks)
    assert not Peer("192.168.0.1", None).allowed_by(networks)
    assert not Peer("", None).allowed_by(networks)  # a Unix socket's peer has no address
    assert Peer("10.1.2.3", None).key == ("address", "10.1.2.3")
    with pytest.raises(argparse.ArgumentTypeError, match="is not an address or network"):
        allowed_network("10.0.0.0/33")


def test_a_peer_sees_everyone_its_own_processes_or_none():
    def process(uid: int) -> ProcessInfo:
        return ProcessInfo(100 + uid, "p", credentials=Credentials(uid, uid, (uid,)))

    assert Visibility.everything().shows(process(0)) and Visibility.everything().shows(None)
    assert Visibility.of_uid(65534).shows(process(65534))
    assert not Visibility.of_uid(65534).shows(process(0))
    assert not Visibility.of_uid(65534).shows(None)
    assert not Visibility.nothing().shows(process(0))
