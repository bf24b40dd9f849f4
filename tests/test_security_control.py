"""Attack suite, control plane: live engines (own processes, real ZeroMQ ports) with a cluster token.

- an unauthenticated or wrong-token caller gets a refusal and nothing else (no pid, no addresses,
  no transport descriptors);
- a captured session cannot be replayed, nor taken over by reusing the victim's routing id;
- oversized and malformed frames, handshake floods and a client that never reads its replies do not
  stop the port from serving legitimate peers, and the logs stay bounded;
- an engine refuses to bind a non-loopback address without a token.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator

import msgpack
import numpy as np
import pytest
import zmq
from peers import Peer, sha
from security_tools import packb, raw_request

from tent_core import Engine
from tent_core import auth as tauth
from tent_core.auth import AuthError, AuthRequiredError, ClusterAuth, ZmqClientAuth
from tent_core.metadata import ControlClient, ControlServer
from tent_core.testing import pattern

TOKEN = "control-cluster-token-0123456789ab"
SIZE = 1 << 20


@pytest.fixture(scope="module")
def peer() -> Iterator[Peer]:
    p = Peer(size=SIZE, env=dict(os.environ, TENT_AUTH_TOKEN=TOKEN))
    yield p
    p.close()


def _endpoint(p: Peer) -> str:
    return f"tcp://{p.engine_id}"


def test_unauthenticated_callers_get_nothing(peer: Peer) -> None:
    for frames in ([b"", packb({"op": "describe", "id": 1})], [b"", packb({"op": "ping"})], [b"", b"\x00garbage"]):
        rep = raw_request(_endpoint(peer), frames)
        assert rep is not None and rep[0] == b"" and len(rep) == 2, rep
        assert rep[1].startswith(tauth.DENY_MAGIC) and b"authentication required" in rep[1]
        assert b"pid" not in rep[1] and b"segments" not in rep[1]  # not even part of a describe comes back
    with pytest.raises(AuthError, match="failed to prove"):
        ControlClient(peer.engine_id, auth=ClusterAuth.from_token("wrong-token-0123456789abcdef")).call(
            {"op": "describe"}, 5
        )
    with pytest.raises(AuthError, match="authentication required"):
        ControlClient(peer.engine_id, auth=None).call({"op": "describe"}, 5)
    # the cluster member gets what transports need, and no shm secret
    c = ControlClient(peer.engine_id, auth=ClusterAuth.from_token(TOKEN))
    d = c.call({"op": "describe"}, 5)
    c.close()
    assert d["ok"] and d["pid"] == peer.pid and "rw" in d["segments"]
    assert "secret" not in d["transports"].get("shm", {})


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_legitimate_engine_with_the_token_keeps_working(peer: Peer, transport: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENT_AUTH_TOKEN", TOKEN)
    with Engine(transports=[transport]) as eng:
        buf = eng.allocate(SIZE)
        eng.read(buf, peer.seg("ro"), SIZE, timeout=10)
        assert sha(buf.array) == peer.digest("ro", 0, SIZE)
        buf.array[:] = pattern(SIZE, seed=77)
        eng.write(buf, peer.seg("rw"), SIZE, timeout=10)
        assert peer.digest("rw", 0, SIZE) == sha(buf.array)
    peer.call(cmd="fill", segment="rw", seed=0)


def test_engine_without_the_token_cannot_reach_a_token_engine(peer: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TENT_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("TENT_AUTH_TOKEN_FILE", raising=False)
    with Engine(transports=["tcp"]) as eng:
        buf = eng.allocate(4096)
        with pytest.raises(AuthError, match="requires|refused|authentication"):
            eng.read(buf, peer.seg("rw"), 4096, timeout=10)


def test_session_replay_and_routing_id_takeover_are_refused(peer: Peer) -> None:
    ctx = zmq.Context.instance()
    key = ClusterAuth.from_token(TOKEN).key("control")

    def dealer(ident: bytes) -> zmq.Socket:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.ROUTING_ID, ident)
        s.connect(_endpoint(peer))
        return s

    victim = dealer(b"victim-1")
    ca = ZmqClientAuth(key)
    ca.handshake(victim, 5, prefix=[b""])
    tagged = ca.wrap(packb({"op": "describe", "id": 7}))
    victim.send_multipart([b"", *tagged])
    assert victim.poll(5000)
    d = msgpack.unpackb(ca.unwrap(victim.recv_multipart()[1:]))
    assert d["ok"] and d["pid"] == peer.pid
    victim.send_multipart([b"", *tagged])  # replay on the live session
    assert victim.poll(5000) and victim.recv_multipart()[1].startswith(tauth.DENY_MAGIC)
    victim.close(0)
    time.sleep(0.2)
    thief = dealer(b"victim-1")  # the victim's routing id, after it left
    for frames in ([b"", *tagged], [b"", packb({"op": "describe"})], [b"", tagged[0], b"\x00" * 40]):
        thief.send_multipart(frames)
        assert thief.poll(5000)
        rep = thief.recv_multipart()
        assert rep[1].startswith(tauth.DENY_MAGIC), rep
    thief.close(0)


def test_oversized_malformed_and_flooding_peers_do_not_stop_the_port(peer: Peer) -> None:
    ctx = zmq.Context.instance()
    key = ClusterAuth.from_token(TOKEN).key("control")
    legit = ControlClient(peer.engine_id, auth=ClusterAuth.from_token(TOKEN))
    try:
        # an authenticated peer sending garbage gets error replies
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(_endpoint(peer))
        ca = ZmqClientAuth(key)
        ca.handshake(s, 5, prefix=[b""])
        for payload in (b"\xc1", packb([1, 2, 3]), packb({"op": 5}), packb({"op": "nope"}), packb({"op": "describe", "id": "x"})):
            s.send_multipart([b"", *ca.wrap(payload)])
            assert s.poll(5000)
            rep = msgpack.unpackb(ca.unwrap(s.recv_multipart()[1:]))
            assert rep["ok"] is (payload == packb({"op": "describe", "id": "x"})) or rep.get("error"), rep
        # a frame over control_max_request_bytes: the connection is dropped, nothing is queued
        big = ctx.socket(zmq.DEALER)
        big.setsockopt(zmq.LINGER, 0)
        big.connect(_endpoint(peer))
        big.send_multipart([b"", b"\x00" * (8 << 20)])
        assert not big.poll(1000)
        big.close(0)
        # 3000 handshakes that never finish, from many identities
        flood = ctx.socket(zmq.DEALER)
        flood.setsockopt(zmq.LINGER, 0)
        flood.setsockopt(zmq.RCVHWM, 10)
        flood.connect(_endpoint(peer))
        for _ in range(3000):
            flood.send_multipart([b"", tauth.ClientHandshake(key).hello()])
        # a client that never reads its replies: 5000 requests, nothing read
        sink = ctx.socket(zmq.DEALER)
        sink.setsockopt(zmq.LINGER, 0)
        sink.setsockopt(zmq.RCVHWM, 10)
        sink.setsockopt(zmq.SNDHWM, 10000)  # all 5000 queue on our side even if the server is slow to read
        sink.connect(_endpoint(peer))
        cs = ZmqClientAuth(key)
        cs.handshake(sink, 5, prefix=[b""])
        for _ in range(5000):
            sink.send_multipart([b"", *cs.wrap(packb({"op": "describe"}))], zmq.NOBLOCK)
        t0 = time.monotonic()
        assert legit.call({"op": "ping"}, 20)["ok"]
        assert legit.call({"op": "describe"}, 20)["pid"] == peer.pid
        assert time.monotonic() - t0 < 20
        for sock in (s, flood, sink):
            sock.close(0)
    finally:
        legit.close()


def test_non_loopback_bind_needs_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TENT_AUTH_TOKEN", "TENT_AUTH_TOKEN_FILE", "TENT_REQUIRE_AUTH"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(AuthRequiredError, match="0.0.0.0"):
        ControlServer("0.0.0.0", 0, lambda m: {"ok": True})
    monkeypatch.setenv("TENT_REQUIRE_AUTH", "never")  # the explicit opt-out
    srv = ControlServer("0.0.0.0", 0, lambda m: {"ok": True})
    srv.close()
    monkeypatch.setenv("TENT_REQUIRE_AUTH", "non_loopback")
    monkeypatch.setenv("TENT_AUTH_TOKEN", TOKEN)
    srv = ControlServer("0.0.0.0", 0, lambda m: {"ok": True})
    try:
        c = ControlClient(f"127.0.0.1:{srv.port}")
        assert c.call({"op": "ping"}, 5)["ok"]
        c.close()
    finally:
        srv.close()


def test_bad_message_logs_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    srv = ControlServer("127.0.0.1", 0, lambda m: {"ok": True}, auth=None)
    try:
        ctx = zmq.Context.instance()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(f"tcp://127.0.0.1:{srv.port}")
        with caplog.at_level(logging.WARNING, "tent_core.metadata"):
            # in waves below the server's reply queue per peer (control_send_hwm, 256): a peer that
            # sends 500 without reading may lose replies past that bound, by design
            got = 0
            deadline = time.monotonic() + 20
            for _wave in range(5):
                for _ in range(100):
                    s.send_multipart([b"", b"\xc1junk"])
                want = got + 100
                while got < want and time.monotonic() < deadline:
                    if s.poll(1000):
                        s.recv_multipart()
                        got += 1
        assert got == 500  # every bad frame got its error reply...
        lines = [r for r in caplog.records if "undecodable" in r.getMessage()]
        assert 1 <= len(lines) <= 15  # ...but the log did not get 500 lines
        s.close(0)
    finally:
        srv.close()


def test_numpy_pattern_sanity() -> None:
    # the suite's byte checks use non-repeating patterns
    a = pattern(SIZE, seed=1)
    assert len(np.unique(a[:4096])) > 200
