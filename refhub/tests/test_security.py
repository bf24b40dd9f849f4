"""Attack suite, refhub: a live reference server (its own process, real ZeroMQ sockets, a token),
attacked by clients speaking the wire protocol directly; plus hypothesis fuzzing of the protocol
validation and of the state machine.

Issue 13's attacks, each refused with a clear error while the legitimate clients keep working:
unauthenticated and wrong-token clients; publish/unpublish/re-bind (hb)/transactions on another
client's handle; model-name squatting and shard takeover; an offload replica with a huge num_shards;
wait with NaN/inf/nil timeouts; a client that never reads its replies; floods of bad messages (logs
stay bounded); oversized frames.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from refhub.state import ServerState

from refhub import protocol
from tent_core import auth as tauth
from tent_core.auth import AuthError, ClusterAuth, SessionLost, ZmqClientAuth

TOKEN = "refhub-cluster-token-0123456789abcd"
KEY = ClusterAuth.from_token(TOKEN).key("refhub")


class LiveServer:
    """`refhub serve` in its own process, with a token; its stderr (the log) is collected."""

    def __init__(self, hb_timeout: float = 3.0, pipeline: bool = True) -> None:
        env = dict(os.environ, REFHUB_AUTH_TOKEN=TOKEN)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "refhub.cli", "serve", "--bind", "tcp://127.0.0.1:0", "--hb-timeout", str(hb_timeout),
             "--pipeline" if pipeline else "--no-pipeline"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd="/",
        )
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        m = re.search(r"listening on (\S+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r} {self.proc.stderr.read()}")  # type: ignore[union-attr]
        self.address = m.group(1)
        self.log: list[str] = []
        self._t = threading.Thread(target=self._drain, daemon=True)
        self._t.start()

    def _drain(self) -> None:
        for line in self.proc.stderr:  # type: ignore[union-attr]
            self.log.append(line)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


class Raw:
    """A client speaking the wire protocol directly (what an attacker would do)."""

    def __init__(self, address: str, key: bytes | None = KEY, cid: bytes | None = None, ident: bytes | None = None,
                 read: bool = True) -> None:
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if ident:
            self.sock.setsockopt(zmq.ROUTING_ID, ident)
        if not read:
            self.sock.setsockopt(zmq.RCVHWM, 1)
        self.sock.connect(address)
        self.auth = ZmqClientAuth(key)
        self.cid = cid if cid is not None else os.urandom(16)
        self.rid = 0
        self.inbox: list[dict[str, Any]] = []
        if key is not None:
            self.auth.handshake(self.sock, 5)

    def send(self, msg: dict[str, Any], cid: bool = True) -> int:
        self.rid += 1
        m = dict(msg, rid=self.rid)
        if cid and self.cid:
            m["cid"] = self.cid
        self.sock.send_multipart(self.auth.wrap(msgpack.packb(m, use_bin_type=True)), zmq.NOBLOCK)
        return self.rid

    def recv(self, rid: int | None = None, timeout: float = 5.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for i, rep in enumerate(self.inbox):
                if rid is None or rep.get("rid") == rid:
                    return self.inbox.pop(i)
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000) + 1):
                raise TimeoutError(f"no reply to rid {rid}")
            reps = msgpack.unpackb(self.auth.unwrap(self.sock.recv_multipart()), raw=False, strict_map_key=False)
            self.inbox.extend(reps if isinstance(reps, list) else [reps])

    def call(self, msg: dict[str, Any], timeout: float = 5.0, cid: bool = True) -> dict[str, Any]:
        return self.recv(self.send(msg, cid), timeout)

    def close(self) -> None:
        self.sock.close(0)


@pytest.fixture
def server() -> Iterator[LiveServer]:
    s = LiveServer()
    yield s
    s.close()


def _open(c: Raw, model: str = "m", replica: str = "r0", shard: int = 0, n: int = 1, **kw: Any) -> int:
    rep = c.call({"op": "open", "model": model, "replica": replica, "shard": shard, "num_shards": n, **kw})
    assert rep["ok"], rep
    return rep["h"]


def test_unauthenticated_and_wrong_token_clients_are_refused(server: LiveServer) -> None:
    plain = Raw(server.address, key=None)
    plain.send({"op": "stats"})
    assert plain.sock.poll(5000)
    frames = plain.sock.recv_multipart()
    assert frames[0].startswith(tauth.DENY_MAGIC) and b"authentication required" in frames[0]
    with pytest.raises(AuthError, match="failed to prove"):
        Raw(server.address, key=ClusterAuth.from_token("wrong-token-0123456789abcdef").key("refhub"))
    # the token of the engines' control plane is not the refhub key: purposes are separate
    with pytest.raises(AuthError):
        Raw(server.address, key=ClusterAuth.from_token(TOKEN).key("control"))
    legit = Raw(server.address)
    st_ = legit.call({"op": "stats"})
    assert st_["ok"] and st_["auth"] is True and st_["denied"] >= 1  # (wrong tokens fail on the client side)
    for c in (plain, legit):
        c.close()


def test_only_the_owner_acts_on_a_handle(server: LiveServer) -> None:
    owner, thief, reader = Raw(server.address), Raw(server.address), Raw(server.address)
    h = _open(owner)
    ref = {"seg": "owner-host:1/seg", "total": 100}
    assert owner.call({"op": "publish", "h": h, "version": 1, "ref": ref, "checksum": [11, 22]})["ok"]
    # the thief knows (or guesses) the handle id: every action on it is refused, by name
    for msg in ({"op": "publish", "h": h, "version": 2, "ref": {"seg": "evil"}, "checksum": [6, 6]},
                {"op": "unpublish", "h": h}, {"op": "close", "h": h}, {"op": "list", "h": h},
                {"op": "wait", "h": h, "pred": {"version_at_least": 1}, "timeout": 0.1},
                {"op": "replicate", "h": h, "version": 1}, {"op": "update", "h": h},
                {"op": "progress", "h": h, "done": 5}, {"op": "replicate_done", "h": h, "ok": True}):
        rep = thief.call(msg)
        assert not rep["ok"] and rep["err"] == protocol.E_NOT_OWNER and "belongs to another client" in rep["msg"], rep
    # without its cid, the owner's own connection is not the owner either (the cid is the credential)
    assert owner.call({"op": "unpublish", "h": h}, cid=False)["err"] == protocol.E_NOT_OWNER
    # hb with the victim's handle: neither kept alive nor re-bound (the owner keeps getting its replies)
    hb = thief.call({"op": "hb", "hs": [h, 999999]})
    assert hb["denied"] == [h] and hb["unknown"] == [999999]
    assert owner.call({"op": "list", "h": h})["ok"]
    # a reader gets the owner's reference and checksum, not the thief's
    rh = _open(reader, replica="r1")
    rep = reader.call({"op": "replicate", "h": rh, "version": 1})
    assert rep["ok"] and rep["src"]["ref"] == ref and rep["checksum"] == [11, 22], rep
    assert reader.call({"op": "replicate_done", "h": rh, "ok": True})["ok"]
    # and the owner still unpublishes its own handle
    assert owner.call({"op": "unpublish", "h": h})["ok"]
    for c in (owner, thief, reader):
        c.close()


def test_squatting_and_shard_takeover_rules(server: LiveServer) -> None:
    squatter, user = Raw(server.address), Raw(server.address)
    hs = _open(squatter, model="llama", n=7)
    rep = user.call({"op": "open", "model": "llama", "replica": "u", "shard": 0, "num_shards": 8})
    assert not rep["ok"] and rep["err"] == protocol.E_MODEL and "has 7 shards" in rep["msg"], rep
    # another client cannot take over a live shard by re-opening it
    rep = user.call({"op": "open", "model": "llama", "replica": "r0", "shard": 0, "num_shards": 7})
    assert not rep["ok"] and rep["err"] == protocol.E_NOT_OWNER and "live client" in rep["msg"], rep
    # the squatter leaves: the name and its shape are free again
    assert squatter.call({"op": "close", "h": hs})["ok"]
    _open(user, model="llama", replica="u", n=8)
    # a silent holder (no heartbeats for takeover_after = hb_timeout/2) can be replaced
    ghost = Raw(server.address)
    _open(ghost, model="g", replica="r0")
    time.sleep(1.8)
    takeover = user.call({"op": "open", "model": "g", "replica": "r0", "shard": 0, "num_shards": 1})
    assert takeover["ok"], takeover
    for c in (squatter, user, ghost):
        c.close()


@pytest.mark.parametrize("bad", [
    {"op": "open", "model": "m", "replica": "off", "shard": 0, "num_shards": 10**9, "kind": "offload"},
    {"op": "open", "model": "m", "replica": "off", "shard": 0, "num_shards": 2**62, "kind": "offload"},
    {"op": "open", "model": "m", "replica": "r", "shard": 0, "num_shards": 1, "kind": "weird"},
    {"op": "open", "model": "x" * 10_000, "replica": "r", "shard": 0, "num_shards": 1},
    {"op": "open", "model": "m", "replica": "r", "shard": 0, "num_shards": 1, "retain": {"keep_latest": 10**12}},
    {"op": "publish", "h": 1, "version": 2**40},
    {"op": "replicate", "h": 1, "version": "latest-99999999999"},
    {"op": "progress", "h": 1, "done": -1},
    {"op": "hb", "hs": list(range(70_000))},
    {"op": "stats", "rid": 2**64 - 1},
])
def test_out_of_bounds_fields_are_refused(server: LiveServer, bad: dict[str, Any]) -> None:
    c = Raw(server.address)
    rid = bad.pop("rid", None)
    if rid is not None:  # a rid the server cannot echo: the error comes back with rid 0
        c.sock.send_multipart(c.auth.wrap(msgpack.packb(dict(bad, rid=rid))))
        rep = c.recv(0)
    else:
        rep = c.call(bad)
    assert not rep["ok"] and rep["err"] == protocol.E_BAD_MESSAGE, rep
    st_ = c.call({"op": "stats"})
    assert st_["ok"] and st_["handles"] == 0 and st_["models"] == 0  # nothing was half-created
    c.close()


@pytest.mark.parametrize("timeout", [math.nan, math.inf, -math.inf, -1.0, None, 1e12, "5"])
def test_wait_timeouts_must_be_finite_and_leave_no_transaction(server: LiveServer, timeout: Any) -> None:
    c = Raw(server.address)
    h = _open(c)
    rep = c.call({"op": "wait", "h": h, "pred": {"version_at_least": 1}, "timeout": timeout})
    assert not rep["ok"] and rep["err"] == protocol.E_BAD_MESSAGE and "timeout" in rep["msg"], rep
    # no half-done transaction: the handle's next transactional call is call 0 and completes
    rep = c.call({"op": "wait", "h": h, "pred": {"version_at_least": 1}, "timeout": 0.2}, timeout=5)
    assert rep["ok"] and rep["met"] is False and rep.get("timeout") is True, rep
    rep = c.call({"op": "list", "h": h})
    assert rep["ok"] and rep["model"] == "m"
    c.close()


def test_a_client_that_never_reads_cannot_grow_the_server() -> None:
    server = LiveServer(hb_timeout=60, pipeline=False)  # without pipelining every reader is sent the publisher's ref
    try:
        _never_reads(server)
    finally:
        server.close()


def _never_reads(server: LiveServer) -> None:
    pub = Raw(server.address)
    hp = _open(pub, replica="pub")
    big_ref = {"seg": "pub:1/seg", "pad": b"\x00" * (1 << 20)}  # every replicate reply carries it
    assert pub.call({"op": "publish", "h": hp, "version": 1, "ref": big_ref})["ok"]
    sink = Raw(server.address, read=False)
    hs = []
    for i in range(400):
        hs.append(sink.send({"op": "open", "model": "m", "replica": f"s{i}", "shard": 0, "num_shards": 1}))
    # the open replies are small; read them (slowly) to learn the handle ids, then stop reading
    ids = [sink.recv(rid, timeout=30)["h"] for rid in hs]
    for h in ids:  # 400 replies of ~1 MiB each: 400 MiB if the server queued them all
        sink.send({"op": "replicate", "h": h, "version": 1})
    legit = Raw(server.address)
    deadline = time.monotonic() + 60
    st_ = legit.call({"op": "stats"}, timeout=30)
    while st_["dropped"] == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
        st_ = legit.call({"op": "stats"}, timeout=30)
    assert st_["dropped"] > 0, st_  # replies beyond the client's queue were dropped, not buffered
    with open(f"/proc/{server.proc.pid}/status") as f:
        rss_kb = int(f.read().split("VmRSS:")[1].split()[0])
    assert rss_kb < 250_000, rss_kb  # ~SEND_HWM x 1 MiB at most, plus the interpreter (400 MiB if all queued)
    assert legit.call({"op": "list", "model": "m"}, timeout=30)["ok"]  # and everyone else is served
    for c in (pub, sink, legit):
        c.close()


def test_bad_message_floods_get_replies_and_bounded_logs(server: LiveServer) -> None:
    c = Raw(server.address)
    n = 2000
    for i in range(n):
        c.sock.send_multipart(c.auth.wrap(b"\xc1" if i % 2 else msgpack.packb({"op": "nope", "rid": i + 1})))
    got = 0
    deadline = time.monotonic() + 30
    while got < n and time.monotonic() < deadline:
        if c.sock.poll(1000):
            reps = msgpack.unpackb(c.auth.unwrap(c.sock.recv_multipart()), raw=False, strict_map_key=False)
            got += len(reps) if isinstance(reps, list) else 1
    assert got == n  # every bad message got an error reply
    # an oversized frame: the connection is dropped, the server keeps serving
    big = Raw(server.address)
    big.sock.send_multipart(big.auth.wrap(b"\x00" * (65 << 20)))
    assert c.call({"op": "stats"})["ok"]
    time.sleep(0.5)
    bad_lines = [ln for ln in server.log if "bad message" in ln or "bad frame" in ln]
    assert 1 <= len(bad_lines) <= 30, len(bad_lines)
    assert c.call({"op": "stats"})["log_suppressed"] > n / 2
    for x in (c, big):
        x.close()


def test_routing_id_takeover_after_disconnect_is_refused(server: LiveServer) -> None:
    victim = Raw(server.address, ident=b"victim")
    h = _open(victim)
    # a frame the attacker captured on the wire (the server has seen it: it was delivered)
    frame = victim.auth.wrap(msgpack.packb({"op": "unpublish", "h": h, "rid": 99, "cid": victim.cid}))
    victim.sock.send_multipart(frame)
    assert victim.recv(99)["ok"]
    victim.close()
    time.sleep(0.3)
    thief = Raw(server.address, key=None, ident=b"victim")  # the victim's routing id, after it left
    close = msgpack.packb({"op": "close", "h": h, "rid": 100, "cid": victim.cid})
    for frames in (frame, [close, frame[1]], [close, os.urandom(40)], [close]):
        thief.sock.send_multipart(frames)
        assert thief.sock.poll(5000)
        assert thief.sock.recv_multipart()[0].startswith(tauth.DENY_MAGIC)
    legit = Raw(server.address)
    assert legit.call({"op": "stats"})["handles"] == 1  # the victim's handle was not closed
    for c in (thief, legit):
        c.close()


def test_the_client_library_authenticates_and_owns_its_handles(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from refhub.client import Connection, RefhubError, query

    monkeypatch.setenv("REFHUB_AUTH_TOKEN", TOKEN)
    conn = Connection(server.address, hb_interval=0.2)
    try:
        rep = conn.request({"op": "open", "model": "lib", "replica": "r", "shard": 0, "num_shards": 1}, 5)
        h = rep["h"]
        assert conn.request({"op": "publish", "h": h, "version": 3, "ref": {"seg": "x"}}, 5)["ok"]
        assert query(server.address, {"op": "list", "model": "lib"})["latest"] == 3
        thief = Raw(server.address)
        assert thief.call({"op": "unpublish", "h": h})["err"] == protocol.E_NOT_OWNER
        thief.close()
        assert conn.request({"op": "unpublish", "h": h}, 5)["ok"]
    finally:
        conn.close()
    monkeypatch.setenv("REFHUB_AUTH_TOKEN", "a-wrong-token-0123456789abcdef")
    conn = Connection(server.address, hb_interval=0.2)
    try:
        with pytest.raises(RefhubError, match="auth"):
            conn.request({"op": "stats"}, 5)
    finally:
        conn.close()
    monkeypatch.delenv("REFHUB_AUTH_TOKEN")
    monkeypatch.delenv("TENT_AUTH_TOKEN", raising=False)
    with pytest.raises(SessionLost, match="authentication required"):
        query(server.address, {"op": "stats"})
    conn = Connection(server.address, hb_interval=0.2)  # no token at all: a clear error, not a timeout
    try:
        t0 = time.monotonic()
        with pytest.raises(RefhubError, match="authentication required"):
            conn.request({"op": "stats"}, 20)
        assert time.monotonic() - t0 < 10
    finally:
        conn.close()


def test_binding_non_loopback_without_a_token_is_refused() -> None:
    env = {k: v for k, v in os.environ.items() if "AUTH_TOKEN" not in k}
    p = subprocess.run([sys.executable, "-m", "refhub.cli", "serve", "--bind", "tcp://0.0.0.0:0"],
                       capture_output=True, text=True, env=env, timeout=60, cwd="/")
    assert p.returncode != 0 and "no auth token configured" in p.stderr, p.stderr


# ------------------------------------------------------------------------- fuzzing
_names = st.sampled_from(["m", "n", "", "x" * 300])
_ints = st.one_of(st.integers(-3, 6), st.integers(-(2**64), 2**64), st.sampled_from([2**24, 2**40, 2**63]))
_scalars = st.one_of(st.none(), st.booleans(), _ints, st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                     st.binary(max_size=20))
_field_values = st.one_of(_scalars, st.lists(_ints, max_size=4), st.dictionaries(st.text(max_size=12), _scalars, max_size=3))
_pred = st.dictionaries(st.sampled_from(list(protocol.PREDICATES) + ["bogus"]),
                        st.one_of(_ints, st.lists(_ints, max_size=3)), min_size=0, max_size=2)


@st.composite
def _message(draw: Any) -> Any:
    """Mostly well-formed requests with hostile values; sometimes plain junk."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.one_of(_scalars, st.lists(_scalars, max_size=3)))
    op = draw(st.sampled_from(sorted(protocol.SCHEMA) + ["bogus"]))
    msg: dict[str, Any] = {"op": op, "rid": draw(st.integers(0, 50))}
    fields = protocol.SCHEMA.get(op, {})
    for name in fields:
        if draw(st.integers(0, 4)):
            if name in ("model", "replica"):
                msg[name] = draw(_names)
            elif name in ("h", "shard", "num_shards", "version", "done", "txn"):
                msg[name] = draw(_ints)
            elif name == "pred":
                msg[name] = draw(_pred)
            elif name == "hs":
                msg[name] = draw(st.lists(_ints, max_size=4))
            elif name == "kind":
                msg[name] = draw(st.sampled_from(["normal", "offload", "x", None]))
            else:
                msg[name] = draw(_field_values)
    if draw(st.booleans()):
        msg["cid"] = draw(st.sampled_from([b"A" * 16, b"B" * 16, b"short", "C" * 16]))
    return msg


def test_ref_msgpack_cannot_carry_is_a_protocol_error() -> None:
    """Found by the fuzzer: an int beyond 64 bits in 'ref' raised OverflowError from the size check."""
    for ref in ({"": -(1 << 63) - 1}, {"x": 1 << 64}, {"x": object()}):
        with pytest.raises(protocol.ProtocolError, match="cannot be packed"):
            protocol.validate({"op": "update", "rid": 0, "h": 0, "ref": ref})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_message())
def test_fuzz_validation_accepts_or_refuses_with_a_protocol_error(msg: Any) -> None:
    try:
        protocol.validate(msg)
    except protocol.ProtocolError:
        pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(st.tuples(st.sampled_from(["c0", "c1", "c2"]), _message(), st.floats(0, 3)), max_size=40))
def test_fuzz_state_machine_never_fails_and_keeps_its_invariants(steps: list[tuple[str, Any, float]]) -> None:
    s = ServerState(hb_timeout=2.0, barrier_timeout=1.0, max_handles=20, max_handles_per_owner=8, max_models=4)
    now = 0.0
    for client, msg, dt in steps:
        now += dt
        for dest, rep in s.handle(client, msg, now) + s.tick(now):
            assert isinstance(rep, dict) and dest in ("c0", "c1", "c2")
            assert rep.get("err") != "internal", (msg, rep)
            assert "rid" in rep or "ev" in rep
        s.check_invariants()
    assert s.errors >= 0 and len(s.handles) <= 20 and len(s.models) <= 4
