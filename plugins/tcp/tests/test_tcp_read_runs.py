"""Pipelined runs of READs (tcp_executor.c): the target answers the READs already waiting behind
one in a single sendmsg (send_read_answers), the initiator reads each accepted answer's gap,
payload and the next answer's header in one recvmsg (run_recv). Neither may change a byte of
what goes over the wire or where it lands:

- the server, driven by a raw socket: a burst of more READs than one sendmsg gathers, across two
  regions, with a refused READ, a WRITE and a version-1 READ among them, and a header that
  arrives in two pieces: every answer comes back in order, with its gap and exactly its bytes,
  and the connection serves on;
- the server reads requests through a small buffer (one recv takes what is in: several headers,
  a WRITE's gap and the first bytes of its payload) and holds a WRITE's answer back while the
  next request is in: runs of WRITEs (refused ones among them), and READs of what they just
  wrote, back to back in one send or dribbled in pieces that cut headers, gaps and payloads
  anywhere, land and answer in order exactly as sent one at a time;
- the client: runs longer than the server gathers, mixed with refusals and WRITEs, land byte for
  byte with the right statuses and counters.
"""

from __future__ import annotations

import hashlib
import socket
import struct
import time

import numpy as np
import pytest
from tcp_helpers import READ, WRITE, Server, connect, pattern, run
from tent_tcp.native import TcpExecutor

from tent_core.abi import HINT_SMALL

MAGIC = 0x43544E54
REQ = struct.Struct("<IHHQQQ")
RSP = struct.Struct("<IHHiIQ")
GATHER_READS = 16  # tcp_executor.c: READs one sendmsg answers at most


def _recv_exact(c: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        part = c.recv(n - len(out))
        if not part:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += part
    return bytes(out)


def test_server_answers_a_burst_of_reads_in_order_byte_for_byte(server: Server) -> None:
    ro_bytes = pattern(2, 1 << 20).tobytes()  # tcp_server_proc.py: "ro" holds pattern(2, 1 MiB)
    rw_bytes = pattern(1, 16 << 20).tobytes()  # ... and "rw" pattern(1, 16 MiB)
    ro, rw, rw_len = server.addr("ro"), server.addr("rw"), server.regions["rw"][1]
    rng = np.random.default_rng(7)
    reqs: list[tuple[bytes, tuple[int, int, int, bytes]]] = []  # (request bytes, (reqid, version, gap, payload))
    for i in range(3 * GATHER_READS + 5):  # more than one sendmsg gathers, several times over
        reqid, gap, n = 1000 + i, int(rng.integers(0, 128)), int(rng.integers(1, 96 << 10))
        if i % 7 == 3:  # the region changes: the gather stops there
            off = int(rng.integers(0, (1 << 20) - n))
            reqs.append(
                (REQ.pack(MAGIC, 2, READ | gap << 8, ro + off, n, reqid), (reqid, 2, gap, ro_bytes[off : off + n]))
            )
        elif i == 11:  # refused (runs past the region): a header alone
            reqs.append((REQ.pack(MAGIC, 2, READ | gap << 8, rw + rw_len - 10, 11, reqid), (reqid, 2, -1, b"")))
        elif i == 20:  # a WRITE in the middle of the READs (its payload overwrites nothing read here)
            data = bytes(range(256)) * 4
            reqs.append((REQ.pack(MAGIC, 2, WRITE, rw + rw_len - 4096, len(data), reqid) + data, (reqid, 2, 0, b"")))
        elif i == 30:  # version 1: no gap
            off = int(rng.integers(0, (1 << 20) - n))
            reqs.append((REQ.pack(MAGIC, 1, READ, rw + off, n, reqid), (reqid, 1, 0, rw_bytes[off : off + n])))
        else:
            off = int(rng.integers(0, (8 << 20) - n))
            reqs.append(
                (REQ.pack(MAGIC, 2, READ | gap << 8, rw + off, n, reqid), (reqid, 2, gap, rw_bytes[off : off + n]))
            )
    burst = b"".join(r for r, _ in reqs)
    with socket.create_connection(("127.0.0.1", server.ports[0]), timeout=10) as c:
        c.sendall(burst)
        for reqid, version, gap, payload in (want for _, want in reqs):
            magic, v, echoed, status, _, rid = RSP.unpack(_recv_exact(c, RSP.size))
            assert (magic, v, rid) == (MAGIC, version, reqid)
            if gap < 0:
                assert status < 0 and echoed == 0
                continue
            assert status == 0 and echoed == gap, (reqid, status, echoed, gap)
            assert _recv_exact(c, gap) == bytes(gap)
            assert _recv_exact(c, len(payload)) == payload, reqid
        # a run whose last header arrives in two pieces: the first READs are answered at once,
        # the cut one when its rest comes, and the connection goes on serving
        cut = [REQ.pack(MAGIC, 2, READ | 5 << 8, ro + 64 * k, 4096, 5000 + k) for k in range(4)]
        c.sendall(b"".join(cut)[: 3 * REQ.size + 9])
        for k in range(3):
            assert RSP.unpack(_recv_exact(c, RSP.size))[5] == 5000 + k
            assert _recv_exact(c, 5 + 4096)[5:] == ro_bytes[64 * k : 64 * k + 4096]
        time.sleep(0.05)
        c.sendall(b"".join(cut)[3 * REQ.size + 9 :])
        assert RSP.unpack(_recv_exact(c, RSP.size))[5] == 5003
        assert _recv_exact(c, 5 + 4096)[5:] == ro_bytes[192 : 192 + 4096]


def _mixed_burst(server: Server, seed: int) -> tuple[list[bytes], list[tuple[int, int, int, bytes]], bytes]:
    """Requests back to back: WRITEs of 1 B-100 KiB with every kind of gap (some refused: no
    permission, out of bounds), each followed by READs of what it just wrote. Returns the
    requests, the answers expected (reqid, status sign, gap, payload) and what the WRITEs leave
    in rw[8 MiB, 9 MiB)."""
    rw, rw_len = server.addr("rw"), server.regions["rw"][1]
    ro = server.addr("ro")
    base = 8 << 20
    region = bytearray(pattern(1, 16 << 20).tobytes()[base : base + (1 << 20)])
    rng = np.random.default_rng(seed)
    reqs: list[bytes] = []
    want: list[tuple[int, int, int, bytes]] = []
    reqid = 7000
    for i in range(60):
        n = int(rng.choice([1, 7, 31, 32, 33, 400, 480, 481, 512, 4096, int(rng.integers(1, 100 << 10))]))
        gap, off = int(rng.integers(0, 128)), int(rng.integers(0, (1 << 20) - n))
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        reqid += 1
        if i % 9 == 4:  # refused: its gap and payload are read and dropped, the connection serves on
            addr = ro + off if i % 2 else rw + rw_len - n // 2
            reqs.append(REQ.pack(MAGIC, 2, WRITE | gap << 8, addr, n, reqid) + bytes(gap) + data)
            want.append((reqid, -1, gap, b""))
            continue
        reqs.append(REQ.pack(MAGIC, 2, WRITE | gap << 8, rw + base + off, n, reqid) + bytes(gap) + data)
        want.append((reqid, 0, gap, b""))
        region[off : off + n] = data
        # the first 20: a run of WRITEs alone (more than a connection holds answers back for)
        for _ in range(0 if i < 20 else int(rng.integers(0, 4))):  # READs of it, gathered behind one another
            reqid += 1
            lo = int(rng.integers(0, n))
            m, rgap = int(rng.integers(1, n - lo + 1)), int(rng.integers(0, 128))
            reqs.append(REQ.pack(MAGIC, 2, READ | rgap << 8, rw + base + off + lo, m, reqid))
            want.append((reqid, 0, rgap, data[lo : lo + m]))
    return reqs, want, bytes(region)


@pytest.mark.parametrize("dribble", [False, True])
def test_server_takes_writes_and_reads_of_them_back_to_back(server: Server, dribble: bool) -> None:
    reqs, want, region = _mixed_burst(server, 31 + dribble)
    burst = b"".join(reqs)
    with socket.create_connection(("127.0.0.1", server.ports[0]), timeout=10) as c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not dribble:
            c.sendall(burst)
        else:  # pieces that cut headers, gaps and payloads anywhere, each its own segment
            rng, at = np.random.default_rng(5), 0
            while at < len(burst):
                step = int(rng.choice([1, 5, 20, 31, 33, 100, 511, 513, 3000]))
                c.sendall(burst[at : at + step])
                at += step
                if at < 40_000:
                    time.sleep(0.0005)
        for reqid, sign, gap, payload in want:
            magic, v, echoed, status, _, rid = RSP.unpack(_recv_exact(c, RSP.size))
            assert (magic, v, rid) == (MAGIC, 2, reqid)
            if sign < 0:
                assert status < 0, reqid
                continue
            assert status == 0 and echoed == gap, (reqid, status, echoed, gap)
            if payload:
                assert _recv_exact(c, gap + len(payload)) == bytes(gap) + payload, reqid
    assert server.sha("rw", 8 << 20, 1 << 20) == hashlib.sha256(region).hexdigest()


@pytest.mark.parametrize("inline", [False, True])
def test_long_read_runs_land_byte_for_byte_with_refusals_among_them(server: Server, inline: bool) -> None:
    """One connection and runs of up to 40 requests: the client's one-call-per-answer reads and
    the server's gathered answers meet refusals and WRITEs in the middle of a run."""
    ex = TcpExecutor({"threads": 2, "conns_per_rail": 1, "pipeline": 40, "pipeline_bytes": 4 << 20,
                      "slice_timeout_ms": 2000, "connect_timeout_ms": 500})  # fmt: skip
    try:
        peer = connect(ex, server)
        rw, cap = server.addr("rw"), server.regions["rw"][1]
        whole = pattern(1, 16 << 20)
        rng = np.random.default_rng(11)
        sizes = rng.integers(1, 64 << 10, 40)
        offs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        total = int(sizes.sum())
        for refused in ([], [0], [5, 6, 39], [17]):
            dst = np.zeros(total, np.uint8)
            slices = []
            for i, (o, n) in enumerate(zip(offs, sizes, strict=True)):
                remote = rw + cap - int(n) // 2 if i in refused else rw + int(o)
                slices.append((READ, dst.ctypes.data + int(o), remote, int(n), peer, 0))
            src = pattern(900 + len(refused), 4096)
            slices.insert(23, (WRITE, src.ctypes.data, rw + cap - 4096, 4096, peer, 0))  # outside what is read
            before = ex.rail_counters(peer, 0)
            res = run(ex, slices, inline=inline, hints=HINT_SMALL)
            assert res.done, res
            assert (res.error != 0) == bool(refused), res
            for i, (o, n) in enumerate(zip(offs, sizes, strict=True)):
                part = dst[int(o) : int(o + n)]
                if i in refused:
                    assert not part.any(), i
                else:
                    assert np.array_equal(part, whole[int(o) : int(o + n)]), i
            after = ex.rail_counters(peer, 0)
            assert after["errors"] - before["errors"] == len(refused)
            assert after["slices"] - before["slices"] == 41 - len(refused)
            assert after["connects"] <= 2  # refusals keep the connection (and the express slot's)
    finally:
        ex.close()
