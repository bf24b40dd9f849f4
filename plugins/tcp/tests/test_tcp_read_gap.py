"""The payload gap (wire version 2, tcp_executor.c): a payload is preceded by a gap of zero bytes
the client chose, so that in the kernel's socket buffer pages it sits neither just ahead of its
source nor just behind its destination modulo 4 KiB (4K aliasing made those copies 2-3x slower;
docs/benchmarks.md, "Why tcp READ was slower than WRITE").

- the server: a version-2 READ gets a version-2 answer naming the gap, the gap's zero bytes, then
  exactly the payload; a version-2 WRITE has its gap skipped and only its payload stored; a gap
  above the limit closes the connection; version 1 is served as before;
- the client: the gaps it asks for keep both copies clear of aliasing, for lone requests and for
  the READs of a pipelined run (their answers follow each other in the server's stream), and
  every byte lands where it belongs whatever the alignment.
"""

from __future__ import annotations

import hashlib
import socket
import struct
import threading
from collections.abc import Iterator

import numpy as np
import pytest
from tcp_helpers import READ, WRITE, Server, connect, pattern, run
from tent_tcp.native import TcpExecutor

from tent_core.abi import HINT_SMALL

MAGIC = 0x43544E54
REQ = struct.Struct("<IHHQQQ")
RSP = struct.Struct("<IHHiIQ")
GAP_MAX = 127
ALIAS_BYTES = 64  # tcp_executor.c: a copy's destination this close ahead of its source is slow


def _recv_exact(c: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        part = c.recv(n - len(out))
        if not part:
            break
        out += part
    return bytes(out)


def test_server_puts_the_requested_gap_before_a_read_payload(server: Server) -> None:
    ro = pattern(2, 1 << 20)  # tcp_server_proc.py: region "ro" holds pattern(2, 1 MiB)
    base = server.addr("ro")
    with socket.create_connection(("127.0.0.1", server.ports[0]), timeout=10) as c:
        for reqid, (gap, off, n) in enumerate([(0, 0, 4096), (40, 8, 70000), (GAP_MAX, 4000, 1), (7, 100, 1 << 19)], 1):
            c.sendall(REQ.pack(MAGIC, 2, READ | gap << 8, base + off, n, reqid))
            magic, version, echoed, status, _, rid = RSP.unpack(_recv_exact(c, RSP.size))
            assert (magic, version, echoed, status, rid) == (MAGIC, 2, gap, 0, reqid)
            assert _recv_exact(c, gap) == bytes(gap)
            assert _recv_exact(c, n) == ro[off : off + n].tobytes()
        # a refused version-2 READ: the header alone, no gap and no payload; the connection serves on
        c.sendall(REQ.pack(MAGIC, 2, READ | 9 << 8, base + (1 << 20) - 10, 11, 77))
        _, version, echoed, status, _, rid = RSP.unpack(_recv_exact(c, RSP.size))
        assert (version, echoed, rid) == (2, 0, 77) and status < 0
        c.sendall(REQ.pack(MAGIC, 1, READ, base + 16, 32, 78))  # version 1: no gap, as before
        magic, version, echoed, status, _, rid = RSP.unpack(_recv_exact(c, RSP.size))
        assert (version, echoed, status, rid) == (1, 0, 0, 78)
        assert _recv_exact(c, 32) == ro[16:48].tobytes()


def test_server_skips_the_gap_before_a_write_payload(server: Server) -> None:
    rw = server.addr("rw")
    data = pattern(41, 9000)
    with socket.create_connection(("127.0.0.1", server.ports[0]), timeout=10) as c:
        for reqid, (gap, off, n) in enumerate([(0, 0, 4096), (33, 5000, 4000), (GAP_MAX, 20000, 9000)], 1):
            c.sendall(REQ.pack(MAGIC, 2, WRITE | gap << 8, rw + off, n, reqid) + b"\xee" * gap + data[:n].tobytes())
            magic, version, echoed, status, _, rid = RSP.unpack(_recv_exact(c, RSP.size))
            assert (magic, version, echoed, status, rid) == (MAGIC, 2, gap, 0, reqid)
            assert server.sha("rw", off, n) == hashlib.sha256(data[:n].tobytes()).hexdigest()
        # refused (out of bounds): the gap and the payload are drained, the connection serves on
        c.sendall(REQ.pack(MAGIC, 2, WRITE | 9 << 8, rw + (16 << 20) - 4, 8, 90) + bytes(9 + 8))
        _, version, echoed, status, _, rid = RSP.unpack(_recv_exact(c, RSP.size))
        assert (version, echoed, rid) == (2, 9, 90) and status < 0
        c.sendall(REQ.pack(MAGIC, 1, WRITE, rw + 100, 16, 91) + data[:16].tobytes())
        assert RSP.unpack(_recv_exact(c, RSP.size))[1:6] == (1, 0, 0, 0, 91)
        assert server.sha("rw", 100, 16) == hashlib.sha256(data[:16].tobytes()).hexdigest()


@pytest.mark.parametrize("op,gap", [(WRITE, GAP_MAX + 1), (READ, GAP_MAX + 1), (READ, 255)])
def test_a_gap_the_protocol_does_not_allow_closes_the_connection(server: Server, op: int, gap: int) -> None:
    with socket.create_connection(("127.0.0.1", server.ports[0]), timeout=10) as c:
        c.sendall(REQ.pack(MAGIC, 2, op | gap << 8, server.addr("rw"), 16, 1))
        try:
            reply = c.recv(100)
        except ConnectionResetError:  # closed with the request's unread bytes queued
            reply = b""
        assert reply == b""  # closed, no reply
    peer_check = TcpExecutor({"threads": 2, "slice_timeout_ms": 2000})  # and the server serves others
    try:
        peer = connect(peer_check, server)
        dst = np.zeros(4096, np.uint8)
        assert run(peer_check, [(READ, dst.ctypes.data, server.addr("ro"), 4096, peer, 0)]).error == 0
        assert np.array_equal(dst, pattern(2, 4096))
    finally:
        peer_check.close()


class RecordingServer:
    """Speaks the wire protocol on one port: records each request's (version, op, gap, addr,
    length, connection number) and answers READs with `length` bytes of `addr & 0xff` after the requested gap."""

    def __init__(self) -> None:
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.lsock.settimeout(0.2)
        self.port = self.lsock.getsockname()[1]
        self.seen: list[tuple[int, int, int, int, int, int]] = []  # + the connection's number
        self._conns = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.lsock.accept()
            except (TimeoutError, OSError):
                continue
            self._conns += 1
            t = threading.Thread(target=self._serve, args=(conn, self._conns), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, conn: socket.socket, number: int) -> None:
        conn.settimeout(10)
        with conn:
            while not self._stop.is_set():
                try:
                    hdr = _recv_exact(conn, REQ.size)
                except OSError:
                    return
                if len(hdr) < REQ.size:
                    return
                magic, version, op, addr, length, rid = REQ.unpack(hdr)
                gap = op >> 8 if version == 2 else 0
                op &= 0xFF if version == 2 else 0xFFFF
                self.seen.append((version, op, gap, addr, length, number))
                if op == WRITE:
                    _recv_exact(conn, gap + length)
                    conn.sendall(RSP.pack(MAGIC, version, gap, 0, 0, rid))
                else:
                    conn.sendall(RSP.pack(MAGIC, version, gap, 0, 0, rid) + bytes(gap) + bytes([addr & 0xFF]) * length)

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        self.lsock.close()


@pytest.fixture
def recording() -> Iterator[RecordingServer]:
    s = RecordingServer()
    yield s
    s.close()


def _clear(ahead: int) -> bool:
    """A copy whose destination is `ahead` bytes ahead of its source (mod 4 KiB) is not slowed."""
    return ahead % 4096 == 0 or ahead % 4096 >= ALIAS_BYTES


@pytest.mark.parametrize("pipelined", [False, True])
def test_client_gaps_keep_both_copies_clear_of_4k_aliasing(recording: RecordingServer, pipelined: bool) -> None:
    ex = TcpExecutor(
        {"threads": 2, "conns_per_rail": 1, "slice_timeout_ms": 5000, "pipeline": 64, "pipeline_bytes": 1 << 30}
    )
    try:
        peer = ex.add_peer([""], ["127.0.0.1"], [recording.port])
        remote = 0x7F0000000000  # page aligned: the recording server serves any address
        local = np.zeros(64 << 10, np.uint8)
        base = (-local.ctypes.data) % 4096  # the first page boundary inside `local`
        skews = [0, 8, 24, 40, 63, 64, 100, 4000, 4090]
        cases = [(rs, ls, n) for rs in skews for ls in (0, 24, 4072) for n in (1, 4096, 5000)]
        cases = [(rs, ls, n) for rs, ls, n in cases if base + ls + n <= local.nbytes]
        fill = 0xAA  # never an answer's byte: remote + skew & 0xff for these skews
        for rs, ls, n in [] if pipelined else cases:
            recording.seen.clear()
            local[:] = fill
            dst = local.ctypes.data + base + ls
            res = run(ex, [(READ, dst, remote + rs, n, peer, 0)])
            assert res.error == 0, res
            ((version, op, gap, addr, length, _),) = recording.seen
            assert (version, op, addr, length) == (2, READ, remote + rs, n) and 0 <= gap <= GAP_MAX
            pos = RSP.size + gap  # where the payload starts in the server's stream (from 0)
            assert _clear(pos - addr) and _clear(dst - pos), (rs, ls, n, gap)
            assert np.all(local[base + ls : base + ls + n] == (remote + rs) & 0xFF)
            assert np.all(local[: base + ls] == fill) and np.all(local[base + ls + n :] == fill)
            recording.seen.clear()  # the same alignments written: the payload follows the 32-byte request header
            res = run(ex, [(WRITE, dst, remote + rs, n, peer, 0)])
            assert res.error == 0, res
            ((version, op, gap, addr, length, _),) = recording.seen
            assert (version, op, addr, length) == (2, WRITE, remote + rs, n) and 0 <= gap <= GAP_MAX
            pos = REQ.size + gap
            assert _clear(pos - dst) and _clear(addr - pos), (rs, ls, n, gap)
        if pipelined:  # on a connection, each answer follows the previous one of its run in the server's stream
            recording.seen.clear()
            local[:] = fill
            slices, where = [], {}
            for k, (rs, ls, n) in enumerate(cases[:40]):
                off, raddr = 1024 * k + ls % 512, remote + rs + 8192 * k
                slices.append((READ, local.ctypes.data + off, raddr, min(n, 500), peer, 0))
                where[raddr] = off
            res = run(ex, slices, hints=HINT_SMALL)
            assert res.error == 0, res
            assert len(recording.seen) == len(slices)
            pos: dict[int, int] = {}
            for version, op, gap, addr, length, conn in recording.seen:
                assert (version, op) == (2, READ) and 0 <= gap <= GAP_MAX
                dst = local.ctypes.data + where[addr]
                # where the server is not told where runs start: a run of its own (answers from 0)
                # when the answer is not clear as the next one of the connection's current run
                at = pos.get(conn, 0) + RSP.size + gap
                if not (_clear(at - addr) and _clear(dst - at)):
                    at = RSP.size + gap
                assert _clear(at - addr) and _clear(dst - at), (addr, dst, gap)
                pos[conn] = at + length
                assert np.all(local[where[addr] : where[addr] + length] == addr & 0xFF)
                assert local[where[addr] + length] == fill
    finally:
        ex.close()
