"""The TCP executor's progress timeout and service telemetry (issue 12).

The progress timeout counts time WITHOUT PROGRESS WHILE A SLICE IS SERVED: slices that wait in a
queue, or that move slowly but steadily, never time out; a slice whose bytes stop moving does.
Congestion (a send that cannot hand the kernel a byte for `congestion_ms`) is reported through
the host's note() as a soft signal. The far end is a paced server speaking the executor's wire
protocol over a real loopback socket, so the pace of the bytes is under the test's control.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from tcp_helpers import READ, WRITE, TcpExecutor, run

from tent_core.abi import HINT_SMALL, StatField, Status
from tent_core.rails import RAILS
from tent_core.types import RailInfo

MAGIC, VERSION = 0x43544E54, 1
REQ = struct.Struct("<IHHQQQ")
RSP = struct.Struct("<IHHiIQ")


class PacedServer:
    """Speaks the TNTC wire protocol; serves READ payloads `step` bytes at a time every `interval`
    seconds, and reads WRITE payloads the same way. `stop_after` bytes into a payload it goes
    silent for `stop_for` seconds (socket open, nothing moves). `rcvbuf` shrinks its receive buffer
    so a writer's send buffer fills quickly."""

    def __init__(self, step: int = 64 << 10, interval: float = 0.0, stop_after: int | None = None,
                 stop_for: float = 0.0, rcvbuf: int | None = None) -> None:  # fmt: skip
        self.step, self.interval = step, interval
        self.stop_after, self.stop_for = stop_after, stop_for
        self.lsock = socket.socket()
        if rcvbuf:
            self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.lsock.settimeout(0.2)
        self.port = self.lsock.getsockname()[1]
        self.requests = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._accept_loop, daemon=True)
        self._accept.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.lsock.accept()
            except (TimeoutError, OSError):
                continue
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _recv(self, conn: socket.socket, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n and not self._stop.is_set():
            try:
                part = conn.recv(n - len(buf))
            except TimeoutError:
                continue
            if not part:
                return None
            buf += part
        return bytes(buf) if len(buf) == n else None

    def _pace(self, moved: int, stopped: list[bool]) -> None:
        if self.stop_after is not None and not stopped[0] and moved >= self.stop_after:
            stopped[0] = True
            self._stop.wait(self.stop_for)
        elif self.interval:
            self._stop.wait(self.interval)

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(0.2)
        with conn:
            while not self._stop.is_set():
                hdr = self._recv(conn, REQ.size)
                if hdr is None:
                    return
                magic, version, op, addr, length, rid = REQ.unpack(hdr)
                assert magic == MAGIC and version in (1, 2)
                gap = op >> 8 if version == 2 else 0  # version 2: zero bytes before the payload
                op &= 0xFF if version == 2 else 0xFFFF
                self.requests += 1
                stopped = [False]
                if op == WRITE:
                    if gap and self._recv(conn, gap) is None:
                        return
                    got = 0
                    while got < length:
                        if self._recv(conn, min(self.step, length - got)) is None:
                            return
                        got += min(self.step, length - got)
                        self._pace(got, stopped)
                    conn.sendall(RSP.pack(MAGIC, version, gap, 0, 0, rid))
                    continue
                conn.sendall(RSP.pack(MAGIC, version, gap, 0, 0, rid) + bytes(gap))
                sent = 0
                while sent < length and not self._stop.is_set():
                    n = min(self.step, length - sent)
                    conn.sendall(bytes([(addr + sent) & 0xFF]) * n)
                    sent += n
                    self._pace(sent, stopped)

    def close(self) -> None:
        self._stop.set()
        self._accept.join(5)
        for t in self._threads:
            t.join(5)
        self.lsock.close()


@pytest.fixture
def rail_slot() -> Iterator[int]:
    """The stat_index of a rail of the process's rail table (its row zeroed when acquired) for the
    slices of one test."""
    rail = RAILS.acquire("test-progress", "peer", RailInfo(index=0, name="paced"))
    yield rail.stat_index
    RAILS.release(rail)


def _zero(index: int) -> None:
    RAILS.row(index)[: StatField.GENERATION] = 0  # the counters; the generation names the holder


def _row(slot: int) -> dict[str, int]:
    r = RAILS.row(slot)
    return {f.name: int(r[f]) for f in StatField}


def test_queued_and_slow_but_steady_slices_never_time_out(rail_slot: int) -> None:
    """One connection, a 500 ms progress timeout, a server moving 64 KiB every 40 ms: eight 256 KiB
    slices take ~1.3 s in all, each waiting for the one before, and one slice alone takes ~2.5x the
    timeout. All complete: queue time and slow service are not 'no progress'. (The gap between two
    steps is far below the timeout, so a server thread held up by a loaded machine cannot make a
    slice look stalled.)"""
    srv = PacedServer(step=64 << 10, interval=0.04)
    ex = TcpExecutor({"threads": 2, "conns_per_rail": 1, "slice_timeout_ms": 500, "connect_timeout_ms": 5000})
    try:
        peer = ex.add_peer([""], ["127.0.0.1"], [srv.port])
        n = 256 << 10
        buf = np.zeros(8 * n, np.uint8)
        res = run(ex, [(READ, buf.ctypes.data + i * n, 0x10000 + i * n, n, peer, 0) for i in range(8)],
                  stat_index=rail_slot)  # fmt: skip
        assert res.done and res.error == 0 and not res.retryable, res
        assert res.elapsed > 1.2, res  # really took longer than the timeout, more than twice over
        expect = np.array([(0x10000 + k) & 0xFF for k in range(0, 8 * n, 64 << 10)], np.uint8).repeat(64 << 10)
        assert np.array_equal(buf, expect)
        big = np.zeros(2 << 20, np.uint8)  # 32 steps of 40 ms: ~1.3 s for one slice
        res = run(ex, [(READ, big.ctypes.data, 0, big.size, peer, 0)], stat_index=rail_slot, timeout=30)
        assert res.done and res.error == 0 and res.elapsed > 1.2, res
        row = _row(rail_slot)
        assert row["ERRORS"] == 0 and row["SERVING"] == 0 and row["INFLIGHT_SLICES"] == 0, row
        assert row["BYTES_MOVED"] == 8 * n + big.size, row  # counted as they moved
        assert row["PROGRESS_NS"] > 0 and row["CONGESTION"] == 0, row
    finally:
        ex.close()
        srv.close()


def test_a_slice_whose_bytes_stop_moving_times_out(rail_slot: int) -> None:
    srv = PacedServer(step=64 << 10, interval=0.01, stop_after=512 << 10, stop_for=8.0)
    ex = TcpExecutor({"threads": 2, "conns_per_rail": 1, "slice_timeout_ms": 300, "connect_timeout_ms": 1000})
    try:
        peer = ex.add_peer([""], ["127.0.0.1"], [srv.port])
        buf = np.zeros(1 << 20, np.uint8)
        seen: list[tuple[float, int]] = []
        finished = threading.Event()

        def watch() -> None:  # the rail serves and moves bytes, then serves without moving any
            while not finished.wait(0.01):
                r = _row(rail_slot)
                seen.append((time.monotonic(), r["SERVING"]))

        w = threading.Thread(target=watch)
        w.start()
        try:
            res = run(ex, [(READ, buf.ctypes.data, 0, buf.size, peer, 0)], stat_index=rail_slot, timeout=20)
        finally:
            finished.set()
            w.join()
        assert res.done and res.retryable == [Status.E_TIMEOUT], res
        # ~80 ms of steady progress, then 300 ms without: failed after ~0.38 s, long before the
        # server's 8 s silence ends (the bound only says it did not wait for the bytes to resume)
        assert 0.3 < res.elapsed < 6.0, res
        row = _row(rail_slot)
        assert row["BYTES_MOVED"] >= 512 << 10 and row["SERVING"] == 0, row
        assert any(s > 0 for _, s in seen)
    finally:
        ex.close()
        srv.close()


def test_a_write_into_a_full_send_buffer_reports_congestion_and_goes_on(rail_slot: int) -> None:
    """The receiver stops reading for 0.4 s: the writer's send buffer fills and stops draining.
    That is congestion (reported once, through note()), not a failure: the progress timeout is 2 s
    and the slice completes when the receiver reads again."""
    srv = PacedServer(step=256 << 10, stop_after=256 << 10, stop_for=0.4, rcvbuf=64 << 10)
    ex = TcpExecutor({"threads": 2, "conns_per_rail": 1, "slice_timeout_ms": 2000, "congestion_ms": 100,
                      "sockbuf": 64 << 10})  # fmt: skip
    try:
        peer = ex.add_peer([""], ["127.0.0.1"], [srv.port])
        src = np.ones(8 << 20, np.uint8)
        res = run(ex, [(WRITE, src.ctypes.data, 0, src.size, peer, 0)], stat_index=rail_slot, timeout=20)
        assert res.done and res.error == 0 and not res.retryable, res
        assert res.elapsed > 0.35, res
        row = _row(rail_slot)
        # once for the 0.4 s pause (more only if a loaded machine also holds the reader up elsewhere)
        assert row["CONGESTION"] >= 1 and row["ERRORS"] == 0 and row["BYTES_MOVED"] == src.size, row
    finally:
        ex.close()
        srv.close()


@pytest.mark.parametrize("inline", [False, True], ids=["queued", "inline"])
def test_pipelined_small_requests_slow_but_steady_never_time_out(rail_slot: int, inline: bool) -> None:
    """Small requests (TENT_HINT_SMALL) travel in pipelined runs: all of a run's requests leave at
    once and its answers come back one after another. A 500 ms progress timeout, a server moving
    1 KiB every 20 ms: each 16 KiB answer takes ~0.3 s, a run of four ~1.3 s. None times out (the
    run's connection keeps moving bytes), whether a worker sent the run or the submitting thread
    did (submit_inline; its answers read through progress()); every piece that entered service
    left it and every payload byte was counted as it moved."""
    srv = PacedServer(step=1 << 10, interval=0.02)
    ex = TcpExecutor({"threads": 2, "conns_per_rail": 1, "slice_timeout_ms": 500, "connect_timeout_ms": 5000})
    try:
        peer = ex.add_peer([""], ["127.0.0.1"], [srv.port])
        n, k = 16 << 10, 8
        if inline:  # submit_inline sends only on an idle pooled connection: make one
            warm = np.zeros(n, np.uint8)
            res = run(ex, [(READ, warm.ctypes.data, 0, n, peer, 0)], hints=HINT_SMALL, timeout=30)
            assert res.done and res.error == 0, res
        _zero(rail_slot)
        buf = np.zeros(k * n, np.uint8)
        res = run(ex, [(READ, buf.ctypes.data + i * n, 0x20000 + i * n, n, peer, 0) for i in range(k)],
                  stat_index=rail_slot, inline=inline, hints=HINT_SMALL, timeout=60)  # fmt: skip
        assert res.done and res.error == 0 and not res.retryable, res
        assert res.elapsed > 0.6, res  # longer than the timeout: no answer came back at once
        expect = np.array([(0x20000 + j) & 0xFF for j in range(0, k * n, 1 << 10)], np.uint8).repeat(1 << 10)
        assert np.array_equal(buf, expect)
        row = _row(rail_slot)
        assert row["ERRORS"] == 0 and row["SERVING"] == 0 and row["INFLIGHT_SLICES"] == 0, row
        assert row["BYTES_MOVED"] == k * n, row
    finally:
        ex.close()
        srv.close()


@pytest.mark.parametrize("inline", [False, True], ids=["queued", "inline"])
def test_pipelined_small_requests_whose_answers_stop_time_out(rail_slot: int, inline: bool) -> None:
    """The server answers a request, then goes silent for 8 s with the connection open: the
    requests of the run still waiting for their answers fail with TENT_E_TIMEOUT after the 300 ms
    progress timeout (not at the end of the silence, not never), and leave service."""
    srv = PacedServer(step=64 << 10, stop_after=1, stop_for=8.0)
    ex = TcpExecutor({"threads": 2, "conns_per_rail": 1, "slice_timeout_ms": 300, "connect_timeout_ms": 1000})
    try:
        peer = ex.add_peer([""], ["127.0.0.1"], [srv.port])
        n, k = 4 << 10, 8
        if inline:  # an idle pooled connection (its server thread is now silent: nothing is answered)
            warm = np.zeros(n, np.uint8)
            res = run(ex, [(READ, warm.ctypes.data, 0, n, peer, 0)], hints=HINT_SMALL, timeout=30)
            assert res.done and res.error == 0, res
        _zero(rail_slot)
        buf = np.zeros(k * n, np.uint8)
        res = run(ex, [(READ, buf.ctypes.data + i * n, i * n, n, peer, 0) for i in range(k)],
                  stat_index=rail_slot, inline=inline, hints=HINT_SMALL, timeout=20)  # fmt: skip
        assert res.done and res.retryable and set(res.retryable) == {Status.E_TIMEOUT}, res
        assert 0.3 < res.elapsed < 6.0, res
        row = _row(rail_slot)
        assert row["SERVING"] == 0 and row["INFLIGHT_SLICES"] == 0, row
        assert row["ERRORS"] == len(res.retryable), row
    finally:
        ex.close()
        srv.close()
