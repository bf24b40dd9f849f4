"""Attack suite, TCP data plane through live engines (own processes, real listeners, a token).

- thousands of connections to a data listener (and to the shm fd server) are capped: the target's
  threads and fds stay bounded, it keeps allocating memory and making ZeroMQ sockets under a low
  open-file limit, and a legitimate engine keeps transferring meanwhile;
- memory registered twice (READ_WRITE and READ_ONLY): removing the READ_WRITE registration leaves it
  readable and no longer remotely writable, even for a peer whose view of the target is stale;
- a slow reader does not hold unregister() past its deadline;
- tcp rails on a non-loopback address without a token: the engine refuses to start.
"""

from __future__ import annotations

import os
import resource
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from peers import Peer, sha

from tent_core import Engine
from tent_core.auth import AuthRequiredError, ClusterAuth
from tent_core.errors import PermissionDeniedError
from tent_core.metadata import ControlClient
from tent_core.testing import pattern

TOKEN = "tcp-engine-token-0123456789abcdef"
SIZE = 8 << 20


def _env() -> dict[str, str]:
    return dict(os.environ, TENT_AUTH_TOKEN=TOKEN)


def _describe(p: Peer) -> dict[str, Any]:
    c = ControlClient(p.engine_id, auth=ClusterAuth.from_token(TOKEN))
    try:
        return c.call({"op": "describe"}, 10)
    finally:
        c.close()


@pytest.fixture
def token_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENT_AUTH_TOKEN", TOKEN)


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (512, 512))


@pytest.fixture
def capped_peer() -> Iterator[Peer]:
    cfg = {"transports": {"tcp": {"max_conns": 64, "auth_timeout_ms": 2000}, "shm": {"max_conns": 32}}}
    p = Peer(size=SIZE, config=cfg, env=_env(), preexec_fn=_low_fd_limit)
    yield p
    p.close()


def test_connection_floods_are_capped_and_peers_keep_working(capped_peer: Peer, token_env: None) -> None:
    p = capped_peer
    desc = _describe(p)
    port = int(desc["transports"]["tcp"]["rails"][0]["port"])
    shm_sock = desc["transports"]["shm"]["sock"]
    base = p.call(cmd="stats")
    socks: list[socket.socket] = []
    stop = threading.Event()

    def flood() -> None:  # 2000 idle TCP connections and 1000 to the shm fd server, held open
        for i in range(3000):
            if stop.is_set():
                return
            try:
                if i % 3 == 2:
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                    s.connect("\0" + shm_sock)
                else:
                    s = socket.create_connection(("127.0.0.1", port), timeout=2)
                socks.append(s)
            except OSError:
                pass

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    try:
        with Engine(transports=["tcp"]) as eng:  # a legitimate peer, during the flood
            buf = eng.allocate(SIZE)
            for _ in range(3):
                eng.read(buf, p.seg("ro"), SIZE, timeout=30)
                assert sha(buf.array) == p.digest("ro", 0, SIZE)
        t.join(120)
        st = p.call(cmd="stats")
        assert st["threads"] < base["threads"] + 64 + 32 + 10, (base, st)  # not one thread per connection
        assert st["fds"] < 480, st  # under the 512 limit it runs with
        assert st["tcp"]["refused"] > 0, st
        assert p.call(cmd="allocate", n=8)["ok"], "allocate() must keep working"
        assert p.call(cmd="zmq")["ok"], "new ZeroMQ sockets must keep working"
    finally:
        stop.set()
        t.join(30)
        for s in socks:
            s.close()


def test_removing_one_of_two_registrations_removes_exactly_its_permission(token_env: None) -> None:
    p = Peer(size=1 << 20, env=_env(), transports=["tcp"])
    try:
        p.call(cmd="register_twice")
        with Engine(transports=["tcp"]) as eng:
            buf = eng.allocate(1 << 20)
            buf.array[:] = pattern(1 << 20, seed=33)
            eng.write(buf, p.seg("dual_rw"), 4096, timeout=10)  # writable through the READ_WRITE one
            assert p.digest("dual_ro", 0, 4096) == sha(buf.array[:4096])
            before = p.digest("dual_ro", 0, 1 << 20)
            assert p.call(cmd="unregister", segment="dual_rw")["ok"]
            # this engine still believes dual_rw exists (its view is stale): the target refuses
            buf.array[:] = pattern(1 << 20, seed=34)
            with pytest.raises(PermissionDeniedError):
                eng.write(buf, p.seg("dual_rw"), 4096, timeout=10)
            assert p.digest("dual_ro", 0, 1 << 20) == before
            eng.read(buf, p.seg("dual_ro"), 1 << 20, timeout=10)  # still readable
            assert sha(buf.array) == before
    finally:
        p.close()


def test_slow_reader_does_not_hold_unregister_past_its_deadline(token_env: None) -> None:
    from tent_core import auth

    cfg = {"transports": {"tcp": {"unregister_timeout_ms": 1000}}}
    p = Peer(size=SIZE, config=cfg, env=_env(), transports=["tcp"])
    try:
        desc = _describe(p)
        port = int(desc["transports"]["tcp"]["rails"][0]["port"])
        addr = int(desc["segments"]["rw"][0]["addr"])
        c = socket.socket()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.connect(("127.0.0.1", port))
        auth.client_handshake(c, ClusterAuth.from_token(TOKEN).key("tcp"), timeout=5)  # an authenticated peer
        c.sendall(__import__("struct").pack("<IHHQQQ", 0x43544E54, 1, 0, addr, SIZE, 7))
        stop = threading.Event()

        def trickle() -> None:
            try:
                while not stop.is_set() and c.recv(1024):
                    time.sleep(0.05)
            except OSError:
                pass

        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        time.sleep(0.5)
        res = p.call(cmd="unregister", segment="rw")
        stop.set()
        t.join(5)
        c.close()
        assert res["ok"] and res["secs"] < 5.0, res
        assert p.call(cmd="stats")["tcp"]["cut"] >= 1
    finally:
        p.close()


def test_tcp_rails_on_a_non_loopback_address_need_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TENT_AUTH_TOKEN", "TENT_AUTH_TOKEN_FILE", "TENT_REQUIRE_AUTH"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(AuthRequiredError, match="0.0.0.0"):
        Engine({"transports": {"tcp": {"rails": ["0.0.0.0"]}}}, transports=["tcp"])
    with Engine({"require_auth": "never", "transports": {"tcp": {"rails": ["0.0.0.0"]}}}, transports=["tcp"]) as eng:
        assert "tcp" in eng.transports  # the explicit opt-out (with a loud warning)
    with Engine({"auth_token": TOKEN, "transports": {"tcp": {"rails": ["0.0.0.0"]}}}, transports=["tcp"]) as eng:
        assert "tcp" in eng.transports and eng.auth is not None
