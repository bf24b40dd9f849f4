"""The cluster-secret handshake (tent_core.auth) on its own: pure messages, real sockets, ZeroMQ."""

from __future__ import annotations

import logging
import os
import socket
import threading

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tent_core import auth
from tent_core.auth import (
    AuthError,
    AuthRequiredError,
    ClientHandshake,
    ClusterAuth,
    ServerHandshake,
    SessionLost,
    ZmqClientAuth,
    ZmqServerAuth,
)
from tent_core.ratelog import RateLimitedLog

TOKEN = "test-cluster-token-0123456789abcdef"
KEY = ClusterAuth.from_token(TOKEN).key("control")
OTHER = ClusterAuth.from_token("another-token-0123456789abcdef").key("control")


def _pair(ckey: bytes = KEY, skey: bytes = KEY, cctx: bytes = b"", sctx: bytes = b"") -> tuple[bytes, bytes]:
    c, s = ClientHandshake(ckey, cctx), ServerHandshake(skey, sctx)
    resp = c.on_challenge(s.on_hello(c.hello()))
    session = s.on_response(resp)
    c.on_result(auth.OK_MAGIC)
    return c.session, session


def test_handshake_agrees_on_a_session_and_message_sizes_match_the_spec() -> None:
    c, s = ClientHandshake(KEY), ServerHandshake(KEY)
    hello = c.hello()
    chal = s.on_hello(hello)
    resp = c.on_challenge(chal)
    assert (len(hello), len(chal), len(resp)) == (auth.HELLO_LEN, auth.CHALLENGE_LEN, auth.RESPONSE_LEN) == (48, 72, 40)
    assert s.on_response(resp) == c.session and len(c.session) == 32
    a, b = _pair()
    assert a == b and a != c.session  # fresh nonces: a new session every time


def test_wrong_key_or_context_fails_on_the_side_that_checks_first() -> None:
    with pytest.raises(AuthError, match="failed to prove"):  # the client checks the server first
        _pair(ckey=KEY, skey=OTHER)
    with pytest.raises(AuthError, match="failed to prove"):
        _pair(cctx=b"engine-a", sctx=b"engine-b")
    # a client that skips the server check still cannot produce a valid proof
    s = ServerHandshake(KEY)
    s.on_hello(ClientHandshake(OTHER).hello())
    with pytest.raises(AuthError, match="wrong auth token"):
        s.on_response(auth.RESPONSE_MAGIC + os.urandom(32))


def test_reflection_and_replay_are_refused() -> None:
    # reflection: the server's own proof, sent back as a client proof
    c, s = ClientHandshake(KEY), ServerHandshake(KEY)
    chal = s.on_hello(c.hello())
    with pytest.raises(AuthError):
        s.on_response(auth.RESPONSE_MAGIC + chal[8 + 32 :])
    # replay: a RESPONSE recorded from one session, against a new server challenge
    c1, s1 = ClientHandshake(KEY), ServerHandshake(KEY)
    hello = c1.hello()
    recorded = c1.on_challenge(s1.on_hello(hello))
    s2 = ServerHandshake(KEY)
    s2.on_hello(hello)  # the attacker replays the HELLO too: the server's nonce differs
    with pytest.raises(AuthError):
        s2.on_response(recorded)
    with pytest.raises(AuthError):
        ServerHandshake(KEY).on_response(recorded)  # RESPONSE before HELLO


def test_tokens_keys_and_fingerprints() -> None:
    with pytest.raises(AuthError, match="at least 16"):
        ClusterAuth.from_token("short")
    ca = ClusterAuth.from_token(TOKEN)
    assert len({ca.key(p) for p in auth.PURPOSES}) == len(auth.PURPOSES)
    assert TOKEN not in repr(ca) and ca.key("control").hex() not in repr(ca)
    assert ca.fingerprint == ClusterAuth.from_token(TOKEN + "\n").fingerprint
    assert len(auth.new_token()) >= 40


def test_resolve_policy(caplog: pytest.LogCaptureFixture) -> None:
    assert auth.is_loopback("127.0.0.1") and auth.is_loopback("127.0.0.5:99") and auth.is_loopback("::1")
    assert auth.is_loopback("localhost") and auth.is_loopback("tcp://127.0.0.1:5555") and auth.is_loopback("ipc:///x")
    assert not auth.is_loopback("0.0.0.0") and not auth.is_loopback("198.18.0.1") and not auth.is_loopback("*")
    assert not auth.is_loopback("tcp://*:5555") and not auth.is_loopback("")
    assert isinstance(auth.resolve(TOKEN, ["0.0.0.0"]), ClusterAuth)
    with pytest.raises(AuthRequiredError, match="198.18.0.1"):
        auth.resolve("", ["127.0.0.1", "198.18.0.1"])
    with pytest.raises(AuthRequiredError):
        auth.resolve("", ["127.0.0.1"], require="always")
    assert auth.resolve("", ["127.0.0.1"]) is None
    with caplog.at_level(logging.WARNING, "tent_core.auth"):
        assert auth.resolve("", ["0.0.0.0"], require="never") is None
    assert "WITHOUT authentication" in caplog.text
    with pytest.raises(ValueError):
        auth.resolve("", [], require="sometimes")


def test_token_file(tmp_path: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture) -> None:
    p = tmp_path / "token"  # type: ignore[operator]
    p.write_text(TOKEN + "\n")
    os.chmod(p, 0o600)
    assert auth.load_token(token_file=str(p), env={}) == TOKEN
    assert auth.load_token(env={"TENT_AUTH_TOKEN_FILE": str(p)}) == TOKEN
    assert auth.load_token("explicit", str(p), env={}) == "explicit"
    os.chmod(p, 0o644)
    with caplog.at_level(logging.WARNING, "tent_core.auth"):
        auth.load_token(token_file=str(p), env={})
    assert "chmod 600" in caplog.text
    with pytest.raises(AuthError, match="cannot read"):
        auth.load_token(token_file=str(p) + ".missing", env={})


@pytest.mark.parametrize("kind", [socket.SOCK_STREAM, socket.SOCK_SEQPACKET])
def test_stream_handshake_over_real_sockets(kind: int) -> None:
    a, b = socket.socketpair(socket.AF_UNIX, kind)
    out: dict[str, object] = {}
    t = threading.Thread(target=lambda: out.update(s=auth.server_handshake(b, KEY, context=b"x", timeout=5)))
    t.start()
    session = auth.client_handshake(a, KEY, context=b"x", timeout=5)
    t.join(5)
    assert out["s"] == session
    a.close()
    b.close()


def test_stream_handshake_over_tcp_wrong_token_gets_a_reason() -> None:
    lst = socket.create_server(("127.0.0.1", 0))
    port = lst.getsockname()[1]
    errs: list[Exception] = []

    def serve() -> None:
        conn, _ = lst.accept()
        with conn:
            try:
                auth.server_handshake(conn, KEY, timeout=5)
            except AuthError as exc:
                errs.append(exc)

    t = threading.Thread(target=serve)
    t.start()
    with socket.create_connection(("127.0.0.1", port)) as c:
        # a client that ignores the server's proof and answers anyway: the server refuses it
        hs = ClientHandshake(OTHER)
        c.sendall(hs.hello())
        chal = c.recv(auth.CHALLENGE_LEN, socket.MSG_WAITALL)
        assert len(chal) == auth.CHALLENGE_LEN
        c.sendall(auth.RESPONSE_MAGIC + os.urandom(32))
        res = c.recv(200)
        assert res.startswith(auth.DENY_MAGIC) and b"wrong auth token" in res
    t.join(5)
    assert errs and "wrong auth token" in str(errs[0])
    # a silent client times out (bounded), it does not hold the server forever
    t = threading.Thread(target=serve)
    t.start()
    with socket.create_connection(("127.0.0.1", port)):
        t.join(10)
    assert not t.is_alive()
    lst.close()


def test_stream_handshake_against_a_non_speaker_fails_clearly() -> None:
    a, b = socket.socketpair()
    b.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n" + b"x" * 100)
    with pytest.raises(AuthError, match="does not speak"):
        auth.client_handshake(a, KEY, timeout=2)
    a.close()
    b.close()


# ------------------------------------------------------------------------- ZeroMQ
class _Router:
    """A ROUTER echo server with ZmqServerAuth (single-threaded, driven from the test)."""

    def __init__(self, key: bytes | None) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.auth = ZmqServerAuth(key)
        self.served: list[bytes] = []
        self._stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.sock.poll(50):
                continue
            ident, *body = self.sock.recv_multipart()
            payload, refusal = self.auth.accept(ident, body)
            if refusal is not None:
                self.sock.send_multipart([ident, *refusal])
                continue
            assert payload is not None
            self.served.append(payload)
            self.sock.send_multipart([ident, *self.auth.wrap(ident, b"echo:" + payload)])

    def dealer(self, ident: bytes | None = None) -> zmq.Socket:
        d = self.ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        if ident:
            d.setsockopt(zmq.ROUTING_ID, ident)
        d.connect(f"tcp://127.0.0.1:{self.port}")
        return d

    def close(self) -> None:
        self._stop.set()
        self.t.join(5)
        self.ctx.destroy(linger=0)


def _rpc(d: zmq.Socket, ca: ZmqClientAuth, payload: bytes) -> bytes:
    d.send_multipart(ca.wrap(payload))
    assert d.poll(5000)
    return ca.unwrap(d.recv_multipart())


def test_zmq_session_roundtrip_replay_and_hijack() -> None:
    r = _Router(KEY)
    try:
        d = r.dealer(b"victim")
        ca = ZmqClientAuth(KEY)
        ca.handshake(d, 5)
        assert _rpc(d, ca, b"hi") == b"echo:hi"
        # replay of a captured tagged frame on the same session: refused
        frame = ca.wrap(b"again")
        d.send_multipart(frame)
        assert d.poll(5000) and ca.unwrap(d.recv_multipart()) == b"echo:again"
        d.send_multipart(frame)
        assert d.poll(5000)
        with pytest.raises(SessionLost, match="replayed"):
            ca.unwrap(d.recv_multipart())
        # the victim leaves; an attacker takes its routing id and replays / forges: nothing is served
        d.close(0)
        n = len(r.served)
        for _ in range(20):  # until the router has let go of the victim's id (a live duplicate is ignored)
            atk = r.dealer(b"victim")
            atk.send_multipart(frame)
            if atk.poll(500):
                break
            atk.close(0)
        assert atk.recv_multipart()[0].startswith(auth.DENY_MAGIC)
        atk.send_multipart([b"describe"])
        assert atk.poll(5000) and b"authentication required" in atk.recv_multipart()[0]
        assert len(r.served) == n
        # a client with the wrong token never gets a session
        with pytest.raises(AuthError):
            ZmqClientAuth(OTHER).handshake(r.dealer(), 5)
        # a client without a token gets a clear refusal
        plain = ZmqClientAuth(None)
        d2 = r.dealer()
        with pytest.raises(SessionLost, match="authentication required"):
            _rpc(d2, plain, b"x")
    finally:
        r.close()


def test_zmq_auth_off_server_refuses_a_client_that_expects_auth() -> None:
    r = _Router(None)
    try:
        with pytest.raises(AuthError, match="authentication off"):
            ZmqClientAuth(KEY).handshake(r.dealer(), 5)
        assert _rpc(r.dealer(), ZmqClientAuth(None), b"p") == b"echo:p"
    finally:
        r.close()


def test_zmq_sessions_and_handshakes_are_bounded() -> None:
    sa = ZmqServerAuth(KEY, max_sessions=4, max_pending=3, handshake_timeout_s=1.0)
    for i in range(10):
        (chal,) = sa.accept(b"p%d" % i, [ClientHandshake(KEY).hello()], now=0.0)[1]  # type: ignore[misc]
        assert chal.startswith(auth.CHALLENGE_MAGIC)
    assert len(sa._pending) == 3
    for i in range(6):
        c = ClientHandshake(KEY)
        chal = sa.accept(b"c%d" % i, [c.hello()], now=1.0)[1][0]  # type: ignore[index]
        assert sa.accept(b"c%d" % i, [c.on_challenge(chal)], now=1.0)[1] == [auth.OK_MAGIC]
    assert sa.session_count() == 4  # least recently used dropped
    late = ClientHandshake(KEY)
    chal = sa.accept(b"late", [late.hello()], now=2.0)[1][0]  # type: ignore[index]
    refusal = sa.accept(b"late", [late.on_challenge(chal)], now=20.0)[1]
    assert refusal and refusal[0].startswith(auth.DENY_MAGIC + b"handshake: ")
    sa.expire(now=1e9)
    assert sa.session_count() == 0 and not sa._pending


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from([b"a", b"b"]), st.lists(st.binary(max_size=80), min_size=0, max_size=3)),
                max_size=12))
def test_fuzz_unauthenticated_frames_never_reach_the_application(frames: list[tuple[bytes, list[bytes]]]) -> None:
    sa = ZmqServerAuth(KEY)
    for ident, body in frames:
        # prefixes of real handshake messages make the fuzzer reach the interesting branches
        payload, refusal = sa.accept(ident, body, now=0.0)
        assert payload is None and refusal is not None
    assert sa.session_count() == 0


def test_rate_limited_log(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    lg = logging.getLogger("tent.test.ratelog")
    rl = RateLimitedLog(lg, rate_per_s=1.0, burst=3, clock=lambda: now[0], max_keys=2)
    with caplog.at_level(logging.WARNING, "tent.test.ratelog"):
        passed = sum(rl.warning("bad", "bad frame %d", i) for i in range(1000))
        assert passed == 3
        now[0] = 5.0
        assert rl.warning("bad", "bad frame again")
        for k in range(50):  # a flood of distinct keys cannot grow the table past max_keys
            rl.warning(f"k{k}", "x")
    assert "(997 similar message(s) suppressed)" in caplog.text
    assert len(rl._buckets) <= 3 and rl.suppressed_total >= 997


def test_tent_token_command(tmp_path: pytest.TempPathFactory) -> None:
    from click.testing import CliRunner

    from tent_core.cli import main

    r = CliRunner().invoke(main, ["token"])
    assert r.exit_code == 0 and len(r.output.strip()) >= 40
    ClusterAuth.from_token(r.output.strip())
    path = tmp_path / "tok"  # type: ignore[operator]
    r = CliRunner().invoke(main, ["token", "--file", str(path)])
    assert r.exit_code == 0 and os.stat(path).st_mode & 0o777 == 0o600
    assert auth.load_token(token_file=str(path), env={}) != ""
    assert CliRunner().invoke(main, ["token", "--file", str(path)]).exit_code != 0  # never overwrites a token
