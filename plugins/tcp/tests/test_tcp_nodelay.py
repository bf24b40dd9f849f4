"""Every data connection runs with TCP_NODELAY, on both ends (tcp_executor.c: small requests leave at
once, not after Nagle's wait for an ACK). Read from the kernel: each socket of this process whose
one end is the target's rail port, found through /proc/self/fd, asked with getsockopt on a
duplicate of its descriptor."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest
from tcp_helpers import engine_pair

from tent_core import READ, WRITE, Request
from tent_core.engine import Engine
from tent_core.testing import fresh_seed, pattern

KiB = 1024


def _sockets_on(port: int) -> list[tuple[str, int]]:
    """(which end, TCP_NODELAY) of every connected TCP socket of this process with `port` at one end."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            fd = os.dup(int(name))
        except OSError:  # closed meanwhile (the listing's own descriptor, a thread's socket)
            continue
        s = socket.socket(fileno=fd)  # owns the duplicate only
        try:
            if s.family not in (socket.AF_INET, socket.AF_INET6) or s.type != socket.SOCK_STREAM:
                continue
            try:
                mine, theirs = s.getsockname()[1], s.getpeername()[1]
            except OSError:  # a listener
                continue
            if port in (mine, theirs):
                end = "server" if mine == port else "client"
                out.append((end, s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)))
        finally:
            s.close()
    return out


@pytest.fixture
def pair(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Engine, Engine]]:
    yield from engine_pair(monkeypatch)


def test_every_data_connection_runs_with_nodelay_on_both_ends(pair: tuple[Engine, Engine]) -> None:
    a, b = pair
    n, block = 16 * 64 * KiB, 64 * KiB
    remote = a.allocate(n, segment="nd")
    local = b.allocate(n, segment="nd-local")
    seed = fresh_seed()
    local.array[:] = pattern(n, seed)
    seg = a.segment_name("nd")
    # a batch of small requests (the express slot) and a large one (the bulk connections): both kinds open
    b.submit([Request(WRITE, local, i * block, seg, i * block, block) for i in range(16)], deadline=30).wait(30)
    b.submit([Request(READ, local, 0, seg, 0, n)], deadline=30).wait(30)
    assert bytes(local.array) == bytes(remote.array) == bytes(pattern(n, seed))
    port = int(a.transports["tcp"].local_descriptor()["rails"][0]["port"])
    socks = _sockets_on(port)
    ends = {end for end, _ in socks}
    assert ends == {"client", "server"}, socks  # both processes' ends of the connections are ours here
    assert all(nodelay for _, nodelay in socks), socks


def test_the_probe_reads_a_socket_without_nodelay_as_such() -> None:
    """The check above can fail: a plain connection (Nagle on) reads 0 at both ends, one set reads 1."""
    with socket.create_server(("127.0.0.1", 0)) as ls:
        port = ls.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            srv, _ = ls.accept()
            with srv:
                assert sorted(_sockets_on(port)) == [("client", 0), ("server", 0)]
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                assert sorted(_sockets_on(port)) == [("client", 1), ("server", 0)]
