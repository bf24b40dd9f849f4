"""The tcp executor's bounded busy poll (`busy_poll_us`): a waiter reading the answer of a small
request it sent, and a server connection after serving one, poll the socket before sleeping
(adaptive by default: tent/busy_poll.h, its policy tested in test_busy_poll_policy.py).

Polling must change nothing but when a thread notices bytes: every byte lands where it belongs
(small, unaligned, many in flight), a peer that dies or stops while a thread polls for it gives
the same typed error at the same deadline as without polling, and a polling server still stops
promptly."""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest
from tcp_helpers import READ, WRITE, Server, TcpExecutor, connect, run

from tent_core.abi import HINT_SMALL, Status
from tent_core.testing import first_mismatch, fresh_seed, pattern

RETRYABLE = {Status.E_CONNECT, Status.E_IO, Status.E_TIMEOUT, Status.E_REROUTED}
# 0: always sleep (the executor before the poll); 50: the default cap, adaptive; 5000: a poll
# longer than any answer here takes, fixed, so every answer is caught by polling on both sides
POLLS = [0, 50, 5000]


def _adaptive(poll_us: int) -> int:
    return 0 if poll_us >= 5000 else 1


def _client(poll_us: int) -> TcpExecutor:
    return TcpExecutor({"threads": 4, "conns_per_rail": 2, "slice_timeout_ms": 1000, "connect_timeout_ms": 500,
                        "busy_poll_us": poll_us, "busy_poll_adaptive": _adaptive(poll_us)})  # fmt: skip


def _server_cfg(poll_us: int) -> str:
    return f"slice_timeout_ms=1000;busy_poll_us={poll_us};busy_poll_adaptive={_adaptive(poll_us)}"


def _stop(srv: Server) -> None:
    srv.signal(signal.SIGSTOP)  # returns once the server is stopped


def test_busy_poll_config_is_checked() -> None:
    from tent_core.errors import PluginABIError

    for bad in (-1, 10_001, "soon"):
        with pytest.raises(PluginABIError, match="busy_poll_us"):
            TcpExecutor({"busy_poll_us": bad})
    for bad in (-1, 2, "yes"):
        with pytest.raises(PluginABIError, match="busy_poll_adaptive"):
            TcpExecutor({"busy_poll_adaptive": bad})
    TcpExecutor({"busy_poll_us": 0}).close()
    TcpExecutor({"busy_poll_us": 10_000}).close()


@pytest.mark.parametrize("poll_us", POLLS)
def test_small_requests_one_at_a_time_byte_exact(poll_us: int) -> None:
    """One request at a time (the KV-cache loop: each sent inline, its answer read by the waiter),
    sizes from 1 byte to 256 KiB at unaligned offsets, then batches of many in flight; every
    byte checked against a pattern that never repeats, with a fresh seed per round."""
    srv = Server(("127.0.0.1",), _server_cfg(poll_us))
    ex = _client(poll_us)
    try:
        peer = connect(ex, srv)
        rw = srv.addr("rw")
        rng = np.random.default_rng(poll_us + 11)
        total = 8 << 20
        for rnd in range(2):
            seed = fresh_seed()
            src = pattern(total, seed)
            dst = np.zeros(total, np.uint8)
            sizes = [1, 3, 4095, 4097, 65536, 65537, 262143, 262144] + [int(x) for x in rng.integers(1, 256 << 10, 24)]
            for n in sizes:
                off = int(rng.integers(0, total - n))
                res = run(ex, [(WRITE, src.ctypes.data + off, rw + off, n, peer, 0)], inline=True, hints=HINT_SMALL)
                assert res.done and res.error == 0, (rnd, n, res)
                res = run(ex, [(READ, dst.ctypes.data + off, rw + off, n, peer, 0)], inline=True, hints=HINT_SMALL)
                assert res.done and res.error == 0, (rnd, n, res)
                assert first_mismatch(dst[off : off + n], seed, off) is None, (rnd, n, off)
            # many in flight: 64 requests of odd sizes over the whole region, one batch each way
            cuts = np.sort(rng.choice(np.arange(1, total), 63, replace=False))
            bounds = np.concatenate([[0], cuts, [total]])
            reqs = [(int(a), int(b - a)) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b - a <= 256 << 10]
            res = run(ex, [(WRITE, src.ctypes.data + o, rw + o, n, peer, 0) for o, n in reqs], inline=True, hints=HINT_SMALL)
            assert res.done and res.error == 0, res
            dst[:] = 0
            res = run(ex, [(READ, dst.ctypes.data + o, rw + o, n, peer, 0) for o, n in reqs], inline=True, hints=HINT_SMALL)
            assert res.done and res.error == 0, res
            for o, n in reqs:
                assert first_mismatch(dst[o : o + n], seed, o) is None, (rnd, o, n)
        c = ex.rail_counters(peer, 0)
        assert c["errors"] == 0
    finally:
        ex.close()
        srv.close()


@pytest.mark.parametrize("poll_us", [50, 5000])
def test_peer_stopped_while_the_waiter_polls_times_out(poll_us: int) -> None:
    """A peer that stops answering (SIGSTOP: no socket error) while the waiter polls for a small
    request's answer: the request fails with E_TIMEOUT at the progress timeout, not earlier
    (polling is no timeout) and not never."""
    srv = Server(("127.0.0.1",), _server_cfg(poll_us))
    ex = _client(poll_us)
    try:
        peer = connect(ex, srv)
        rw = srv.addr("rw")
        buf = np.zeros(64 << 10, np.uint8)
        assert run(ex, [(READ, buf.ctypes.data, rw, 64 << 10, peer, 0)], inline=True, hints=HINT_SMALL).error == 0
        _stop(srv)
        for op in (READ, WRITE):
            res = run(ex, [(op, buf.ctypes.data, rw, 64 << 10, peer, 0)], timeout=20, inline=True, hints=HINT_SMALL)
            assert res.done and res.retryable == [Status.E_TIMEOUT], res
            assert 0.9 < res.elapsed < 10, res
        srv.signal(signal.SIGCONT)
        res = run(ex, [(READ, buf.ctypes.data, rw, 64 << 10, peer, 0)], timeout=20, inline=True, hints=HINT_SMALL)
        assert res.done and res.error == 0, res  # a fresh connection
    finally:
        srv.signal(signal.SIGCONT)
        ex.close()
        srv.close()


@pytest.mark.parametrize("poll_us", [50, 5000])
def test_peer_killed_mid_request_gives_a_typed_error(poll_us: int) -> None:
    """The server process is killed while small requests are in flight and their waiter polls:
    every request ends with a retryable transport error well before any deadline, never a hang."""
    srv = Server(("127.0.0.1",), _server_cfg(poll_us))
    ex = _client(poll_us)
    try:
        peer = connect(ex, srv)
        rw = srv.addr("rw")
        buf = np.zeros(1 << 20, np.uint8)
        assert run(ex, [(READ, buf.ctypes.data, rw, 4096, peer, 0)], inline=True, hints=HINT_SMALL).error == 0
        _stop(srv)  # requests leave and wait for answers that never come ...
        killer = threading.Timer(0.2, srv.proc.kill)  # ... until the peer dies
        killer.start()
        res = run(ex, [(READ if i % 2 else WRITE, buf.ctypes.data + i * 65536, rw + i * 65536, 65536, peer, 0)
                       for i in range(16)], timeout=20, inline=True, hints=HINT_SMALL)  # fmt: skip
        killer.join()
        assert res.done, res
        assert res.error in RETRYABLE and res.retryable and set(res.retryable) <= RETRYABLE, res
        assert res.elapsed < 10, res
    finally:
        ex.close()
        srv.close()


def test_a_polling_server_stops_promptly() -> None:
    """Server connections that just served a small request poll for the next one (here up to
    10 ms, the longest allowed): closing the executor still ends them at once."""
    srv_ex = TcpExecutor({"busy_poll_us": 10_000})
    ex = _client(10_000)
    try:
        port = srv_ex.listen("127.0.0.1", 0)
        region = np.zeros(1 << 20, np.uint8)
        srv_ex.register_region(region.ctypes.data, region.nbytes, 3)
        peer = ex.add_peer([""], ["127.0.0.1"], [port])
        src = pattern(1 << 20, 7)
        for i in range(8):
            res = run(ex, [(WRITE, src.ctypes.data + i * 4096, region.ctypes.data + i * 4096, 4096, peer, 0)],
                      inline=True, hints=HINT_SMALL)  # fmt: skip
            assert res.done and res.error == 0, res
        assert first_mismatch(region[: 8 * 4096], 7) is None
        t0 = time.monotonic()
        srv_ex.close()
        assert time.monotonic() - t0 < 5
    finally:
        ex.close()
        srv_ex.close()


class _RecordingServer:
    """A minimal target speaking the executor's wire protocol on real sockets (WRITE only): each
    connection on its own thread, every answer held `delay` s, and which connection served
    which request recorded. Lets a test see how a batch was spread over connections."""

    def __init__(self, delay: float) -> None:
        import socket

        self.delay = delay
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.lsock.settimeout(0.2)
        self.port = self.lsock.getsockname()[1]
        self.seen: list[tuple[int, int]] = []  # (connection number, request length)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                c, _ = self.lsock.accept()
            except OSError:
                continue
            t = threading.Thread(target=self._serve, args=(c, n), daemon=True)
            n += 1
            self.threads.append(t)
            t.start()

    @staticmethod
    def _recv(c, n: int) -> bytes:  # type: ignore[no-untyped-def]
        buf = b""
        while len(buf) < n:
            got = c.recv(n - len(buf))
            if not got:
                raise EOFError
            buf += got
        return buf

    def _serve(self, c, conn: int) -> None:  # type: ignore[no-untyped-def]
        import struct

        c.settimeout(10)
        try:
            while not self.stop.is_set():
                magic, ver, op, _addr, length, reqid = struct.unpack("<IHHQQQ", self._recv(c, 32))
                gap = op >> 8 if ver == 2 else 0  # version 2: zero bytes before the payload
                assert magic == 0x43544E54 and ver in (1, 2) and op & 0xFF == WRITE
                self._recv(c, gap + length)
                with self.lock:
                    self.seen.append((conn, length))
                time.sleep(self.delay)
                c.sendall(struct.pack("<IHHiIQ", magic, ver, gap, 0, 0, reqid))
        except (EOFError, OSError):
            pass
        finally:
            c.close()

    def close(self) -> None:
        self.stop.set()
        self.lsock.close()
        for t in self.threads:
            t.join(5)


def test_an_inline_batch_is_shared_out_over_the_idle_connections() -> None:
    """A batch of small requests sent on the submitting thread leaves on every idle connection of
    the rail (the target serves each on its own thread), not as one run on one connection."""
    srv = _RecordingServer(delay=0.3)
    ex = TcpExecutor({"threads": 4, "conns_per_rail": 2, "slice_timeout_ms": 5000, "connect_timeout_ms": 2000})
    try:
        peer = ex.add_peer([""], ["127.0.0.1"], [srv.port])
        src = pattern(3 * 65536, fresh_seed())
        # queued (not inline): the workers share three requests out over the three slots, and as
        # every answer is held 0.3 s, three connections open; afterwards all three are idle
        res = run(ex, [(WRITE, src.ctypes.data + i * 65536, 0, 65536, peer, 0) for i in range(3)], hints=HINT_SMALL)
        assert res.done and res.error == 0, res
        warm = {conn for conn, _ in srv.seen}
        assert len(warm) == 3, srv.seen
        with srv.lock:
            srv.seen.clear()
        res = run(ex, [(WRITE, src.ctypes.data + i * 4096, 0, 4096, peer, 0) for i in range(6)], inline=True,
                  hints=HINT_SMALL)  # fmt: skip
        assert res.done and res.error == 0, res
        assert len(srv.seen) == 6
        assert {conn for conn, _ in srv.seen} == warm, srv.seen  # two requests on each connection
        assert ex.rail_counters(peer, 0)["connects"] == 3
    finally:
        ex.close()
        srv.close()


def _serve_pair(server_cfg: dict[str, int], client_cfg: dict[str, int]):  # type: ignore[no-untyped-def]
    srv_ex = TcpExecutor(server_cfg)
    ex = TcpExecutor({"threads": 4, "conns_per_rail": 2, "slice_timeout_ms": 5000, "connect_timeout_ms": 2000,
                      **client_cfg})  # fmt: skip
    port = srv_ex.listen("127.0.0.1", 0)
    region = np.zeros(1 << 20, np.uint8)
    srv_ex.register_region(region.ctypes.data, region.nbytes, 3)
    peer = ex.add_peer([""], ["127.0.0.1"], [port])
    return srv_ex, ex, peer, region


@pytest.mark.parametrize("adaptive", [0, 1])
def test_a_server_connection_stops_polling_for_a_client_that_pauses(adaptive: int) -> None:
    """A client that pauses 3 ms between small requests (an application computing between them):
    no poll of the server connection for the next request (cap 50 us) can catch it. Fixed
    polling polls before every one of those waits; adaptive polling gives up after a few misses
    and probes only now and then, while every byte still lands."""
    srv_ex, ex, peer, region = _serve_pair({"busy_poll_us": 50, "busy_poll_adaptive": adaptive},
                                           {"busy_poll_us": 0})  # fmt: skip
    try:
        seed = fresh_seed()
        src = pattern(1 << 20, seed)
        n = 150
        for i in range(n):
            off = (i * 4099) % ((1 << 20) - 4096)
            res = run(ex, [(WRITE, src.ctypes.data + off, region.ctypes.data + off, 4096, peer, 0)], inline=True,
                      hints=HINT_SMALL)  # fmt: skip
            assert res.done and res.error == 0, res
            assert first_mismatch(region[off : off + 4096], seed, off) is None
            time.sleep(0.003)
        srv = srv_ex.busy_poll_stats()["server"]
        assert srv["waits"] >= n - 1, srv  # each wait after a small request, on one connection
        if adaptive:
            # six misses stop it; then probes 8, 16, 32, 64 ... waits apart (a late-scheduled
            # server thread may see a request already there and count a hit: generous bound)
            assert srv["polls"] <= 30, srv
        else:
            assert srv["polls"] == srv["waits"], srv
        assert ex.busy_poll_stats()["client"]["polls"] == 0  # busy_poll_us 0: off
    finally:
        ex.close()
        srv_ex.close()


def test_waiters_poll_and_count_their_outcomes() -> None:
    """Small requests one at a time with polling on (fixed, so every wait polls): the client's
    waiter polls before each answer and the server connection before each next request, and the
    counters add up (hits and lost cores are among the polls)."""
    srv_ex, ex, peer, region = _serve_pair({"busy_poll_us": 200, "busy_poll_adaptive": 0},
                                           {"busy_poll_us": 200, "busy_poll_adaptive": 0})  # fmt: skip
    try:
        buf = np.zeros(4096, np.uint8)
        n = 100
        for _ in range(n):
            res = run(ex, [(READ, buf.ctypes.data, region.ctypes.data, 4096, peer, 0)], inline=True, hints=HINT_SMALL)
            assert res.done and res.error == 0, res
        cli, srv = ex.busy_poll_stats()["client"], srv_ex.busy_poll_stats()["server"]
        assert cli["waits"] >= n - 2 and cli["polls"] == cli["waits"], cli
        assert srv["waits"] >= n - 1 and srv["polls"] == srv["waits"], srv
        for c in (cli, srv):
            assert c["hits"] <= c["polls"] and c["lost"] <= c["polls"], c
    finally:
        ex.close()
        srv_ex.close()
