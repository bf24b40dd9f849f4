"""Attack suite, TCP data plane, against a live executor (tcp_server_proc.py: its own process, real
listeners) with a cluster key: raw sockets speaking (or not speaking) the wire protocol.

- no data to a client that does not authenticate (garbage, a request header, the wrong key);
- a slow reader cannot hold unregister(): the connection is cut at unregister_timeout_ms;
- the executor's log is rate limited, not a lifetime budget an attacker can spend;
- hypothesis fuzzing of the request header parser through an authenticated live connection: the
  server never touches memory outside a region it may, and keeps serving.
"""

from __future__ import annotations

import hashlib
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tcp_helpers import HERE, Server, pattern, recv_upto
from tent_tcp.native import TcpExecutor

from tent_core import auth
from tent_core.auth import AuthError, ClusterAuth

TOKEN = "tcp-cluster-token-0123456789abcdef"
KEY = ClusterAuth.from_token(TOKEN).key("tcp")
MAGIC, VERSION = 0x43544E54, 1
REGIONS = {"rw": (16 << 20, 3, 1), "ro": (1 << 20, 1, 2), "wo": (1 << 20, 2, 3), "none": (4096, 0, 4)}  # tcp_server_proc


def header(op: int, addr: int, length: int, reqid: int = 1, magic: int = MAGIC, version: int = VERSION) -> bytes:
    return struct.pack("<IHHQQQ", magic, version, op, addr, length, reqid)


class LoggedServer(Server):
    """tcp_server_proc.py with its stderr (the executor's log) collected."""

    def __init__(self, config: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "tcp_server_proc.py"), "127.0.0.1", config],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        hello = self._readline(30.0)
        self.ips = ["127.0.0.1"]
        self.ports = hello["ports"]
        self.regions = {k: tuple(v) for k, v in hello["regions"].items()}
        self.log: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)


@pytest.fixture(scope="module")
def srv() -> Iterator[LoggedServer]:
    s = LoggedServer(f"auth_key={KEY.hex()};slice_timeout_ms=1000;auth_timeout_ms=1000;unregister_timeout_ms=800")
    yield s
    s.close()


def _connect(s: Server, authenticate: bool = True, key: bytes = KEY, rcvbuf: int = 0) -> socket.socket:
    c = socket.socket()
    if rcvbuf:
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    c.connect(("127.0.0.1", s.ports[0]))
    c.settimeout(5)
    if authenticate:
        auth.client_handshake(c, key, timeout=5)
    return c



def _legit_read(s: Server, region: str = "ro", n: int = 4096) -> bytes:
    c = _connect(s)
    c.sendall(header(0, s.addr(region), n))
    rsp = recv_upto(c, 24)
    assert len(rsp) == 24 and struct.unpack("<i", rsp[8:12])[0] == 0, rsp
    data = recv_upto(c, n)
    c.close()
    return data


def test_no_byte_without_authentication(srv: LoggedServer) -> None:
    before = srv.cmd(cmd="stats")["auth_failures"]
    # a client that starts with a request: the server wanted a HELLO, says so, serves nothing
    c = _connect(srv, authenticate=False)
    c.sendall(header(0, srv.addr("ro"), 4096) + b"\0" * 16)
    got = c.recv(65536)
    assert got.startswith(auth.DENY_MAGIC) and b"expected an auth HELLO" in got
    assert c.recv(65536) == b""  # closed
    c.close()
    # the wrong key: the client itself refuses the server's proof (and sends nothing of value)
    with pytest.raises(AuthError, match="failed to prove"):
        _connect(srv, key=ClusterAuth.from_token("wrong-token-0123456789abcdef").key("tcp"))
    # a client that says nothing is dropped after auth_timeout_ms, without a byte of data
    c = _connect(srv, authenticate=False)
    t0 = time.monotonic()
    assert c.recv(65536) == b"" and time.monotonic() - t0 < 5
    c.close()
    assert srv.cmd(cmd="stats")["auth_failures"] >= before + 2
    ro = pattern(REGIONS["ro"][2], REGIONS["ro"][0])
    assert _legit_read(srv) == ro[:4096].tobytes()  # and the legitimate client is served


def test_slow_reader_cannot_hold_unregister(srv: LoggedServer) -> None:
    c = _connect(srv, rcvbuf=4096)
    c.sendall(header(0, srv.addr("rw"), 16 << 20))
    assert struct.unpack("<i", recv_upto(c, 24)[8:12])[0] == 0
    stop = threading.Event()

    def trickle() -> None:  # reads 1 KiB every 50 ms: always making progress, never finishing
        try:
            while not stop.is_set() and c.recv(1024):
                time.sleep(0.05)
        except OSError:
            pass

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    time.sleep(0.5)
    cut_before = srv.cmd(cmd="stats")["cut"]
    res = srv.cmd(cmd="unregister", region="rw", timeout=30)  # unregister_timeout_ms=800 in this server
    stop.set()
    t.join(5)
    c.close()
    assert res["ok"] and 0.5 < res["secs"] < 5.0, res
    assert srv.cmd(cmd="stats")["cut"] == cut_before + 1  # the slow reader's connection was cut
    srv.cmd(cmd="register", region="rw", perm=3)  # rw is registered again for the other tests


def test_executor_log_is_rate_limited_not_a_budget() -> None:
    s = LoggedServer("slice_timeout_ms=1000")
    try:
        for _ in range(300):
            c = _connect(s, authenticate=False)
            c.sendall(b"X" * 32)  # a bad header: logged, connection closed
            c.recv(16)
            c.close()
        time.sleep(0.3)
        first = len([ln for ln in s.log if "bad request header" in ln])
        assert 1 <= first <= 15, first
        time.sleep(2.5)  # the bucket refills: new events are logged again (a budget would be spent)
        c = _connect(s, authenticate=False)
        c.sendall(b"Y" * 32)
        c.recv(16)
        c.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any("suppressed" in ln for ln in s.log):
            time.sleep(0.05)
        assert any("bad request header" in ln and "suppressed" in ln for ln in s.log), s.log[-3:]
        assert s.cmd(cmd="stats")["log"]["suppressed"] >= 0
    finally:
        s.close()


# a server connection sleeps in poll when its socket timeout (slice_timeout_ms) is longer than the
# idle timeout, else in the recv of the next header, its timeout ticking to count idle time: both
@pytest.mark.parametrize("slice_ms", [1000, 100])
def test_idle_connections_are_closed_and_clients_reconnect(slice_ms: int) -> None:
    from tcp_helpers import run

    s = Server(("127.0.0.1",), f"slice_timeout_ms={slice_ms};idle_timeout_ms=300")
    cli = TcpExecutor({"slice_timeout_ms": 1000, "threads": 2, "idle_timeout_ms": 300})
    try:
        peer = cli.add_peer([""], ["127.0.0.1"], [s.ports[0]])
        dst = np.zeros(4096, np.uint8)
        assert run(cli, [(0, dst.ctypes.data, s.addr("ro"), 4096, peer, 0)]).error == 0
        time.sleep(1.0)  # the server closes the idle connection; the client must not trip over it
        assert s.cmd(cmd="stats")["idle_closed"] >= 1
        res = run(cli, [(0, dst.ctypes.data, s.addr("ro"), 4096, peer, 0)])
        assert res.error == 0 and res.retryable == [], res
    finally:
        cli.close()
        s.close()


def _closed_within(c: socket.socket, limit: float) -> float:
    """Seconds until the server closed `c` (nothing else arrives), failing after `limit`."""
    c.settimeout(limit)
    t0 = time.monotonic()
    assert c.recv(65536) == b""  # closed, without an answer (socket.timeout fails the test)
    return time.monotonic() - t0


# The server's deadlines on a request's bytes, whatever the server sleeps in between requests: a peer
# that stops mid-header or mid-payload is cut after slice_timeout_ms without progress, one that
# trickles is not, and a connection quiet between requests is kept until idle_timeout_ms.
def test_stalled_request_is_cut_after_slice_timeout() -> None:
    s = Server(("127.0.0.1",), "slice_timeout_ms=300;idle_timeout_ms=60000")
    try:
        rw, n = s.addr("rw"), 1 << 20
        quiet = socket.create_connection(("127.0.0.1", s.ports[0]))
        trickle = socket.create_connection(("127.0.0.1", s.ports[0]))
        trickle.sendall(header(1, rw, 8 * 4096))
        for _ in range(8):  # 8 pieces 150 ms apart: 1.2 s in all, each well inside the timeout
            trickle.sendall(b"t" * 4096)
            time.sleep(0.15)
        rsp = recv_upto(trickle, 24)
        assert len(rsp) == 24 and struct.unpack("<i", rsp[8:12])[0] == 0, rsp
        assert s.sha("rw", 0, 8 * 4096) == hashlib.sha256(b"t" * 8 * 4096).hexdigest()
        half_header = socket.create_connection(("127.0.0.1", s.ports[0]))
        half_header.sendall(header(1, rw, 4096)[:16])
        assert 0.2 < _closed_within(half_header, 5.0) < 4.0
        half_payload = socket.create_connection(("127.0.0.1", s.ports[0]))
        half_payload.sendall(header(1, rw, n) + b"x" * (n // 2))
        assert 0.2 < _closed_within(half_payload, 5.0) < 4.0
        quiet.sendall(header(0, s.addr("ro"), 4096))  # quiet for > 1.5 s, several slice timeouts
        rsp = recv_upto(quiet, 24)
        assert len(rsp) == 24 and struct.unpack("<i", rsp[8:12])[0] == 0, rsp
        assert recv_upto(quiet, 4096) == pattern(REGIONS["ro"][2], REGIONS["ro"][0])[:4096].tobytes()
        assert s.cmd(cmd="stats")["idle_closed"] == 0
        for c in (half_header, half_payload, quiet, trickle):
            c.close()
    finally:
        s.close()


REGION_BASE: dict[str, int] = {}
SNAP: dict[str, str] = {}


@st.composite
def _request(draw: st.DrawFn) -> tuple[str, int, int, int, int, int, int]:
    region = draw(st.sampled_from(["rw", "ro", "wo", "none"]))
    op = draw(st.one_of(st.sampled_from([0, 1]), st.integers(0, 0xFFFF)))
    off = draw(st.one_of(st.integers(-4096, 4096), st.integers(-(1 << 62), 1 << 62)))
    length = draw(st.one_of(st.integers(0, 8192), st.integers(0, 2**64 - 1),
                            st.sampled_from([4096, 4097, 1 << 20, (1 << 20) + 1])))
    magic = draw(st.sampled_from([MAGIC, MAGIC, MAGIC, 0, 0x54434E54]))
    version = draw(st.sampled_from([VERSION, VERSION, VERSION, 0, 2, 0xFFFF]))
    return region, op, off, length, magic, version, draw(st.integers(0, 2**64 - 1))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(_request())
def test_fuzz_request_header_through_a_live_listener(srv: LoggedServer, req: tuple[str, int, int, int, int, int, int]) -> None:
    if not REGION_BASE:
        REGION_BASE.update({k: v[0] for k, v in srv.regions.items()})
        _snapshot(srv)
    region, op, off, length, magic, version, reqid = req
    addr = (REGION_BASE[region] + off) % (1 << 64)
    c = _connect(srv)
    try:
        c.sendall(header(op, addr, length, reqid, magic, version))
        if op == 1:
            c.sendall(os.urandom(min(length, 65536)))  # a real writer sends what it announced
        c.settimeout(1.5)
        try:
            c.recv(1 << 16)
        except (TimeoutError, OSError):
            pass
    finally:
        c.close()
    # never outside what it may touch: the read-only and the no-access regions are intact
    for name in ("ro", "none"):
        assert srv.sha(name, 0, REGIONS[name][0]) == SNAP[name], name




def _snapshot(s: Server) -> None:
    for name in ("ro", "none"):
        SNAP[name] = hashlib.sha256(pattern(REGIONS[name][2], REGIONS[name][0]).tobytes()).hexdigest()
        assert s.sha(name, 0, REGIONS[name][0]) == SNAP[name]


def test_server_still_serves_after_the_fuzzing(srv: LoggedServer) -> None:
    ro = pattern(REGIONS["ro"][2], REGIONS["ro"][0])
    assert _legit_read(srv, "ro", 1 << 20) == ro.tobytes()
    assert srv.cmd(cmd="stats")["open"] <= 4
