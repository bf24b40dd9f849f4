"""Waiting READs on the wire (opcode 2, tent_wait_t in executor_abi.h; the executor's header): the
target answers one only once a u64 word in its registered memory reaches [lo, hi]; at its deadline,
or when the word leaves [floor, hi], it answers E_NOT_READY without the bytes; a malformed
condition gets E_PROTOCOL and the connection goes on; the word is checked like any READ (bounds,
read permission); at most `wait_max_parked` READs are parked at once; unregistering a region a
parked READ uses ends its wait (no cut connection). Real sockets against a real executor process."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import pytest
from tcp_helpers import Server, pattern, recv_upto

MAGIC = 0x43544E54
OK, E_BOUNDS, E_PERMISSION, E_PROTOCOL, E_NOT_READY = 0, -10, -11, -12, -15
REGIONS = {"rw": (16 << 20, 3, 1), "ro": (1 << 20, 1, 2), "wo": (1 << 20, 2, 3), "none": (4096, 0, 4)}  # tcp_server_proc
V = 7 << 40  # a progress word's version bits (refhub's layout: version << 40 | bytes)


@pytest.fixture
def srv() -> Iterator[Server]:
    s = Server(config="wait_max_parked=2;wait_max_ms=5000")
    s.cmd(cmd="poke", region="rw", off=0, value=V | 10)
    yield s
    s.close()


def _connect(s: Server) -> socket.socket:
    c = socket.create_connection(("127.0.0.1", s.ports[0]))
    c.settimeout(10)
    return c


def waiting_read(addr: int, n: int, word: int, floor: int, lo: int, hi: int, wait_ms: int, reserved: int = 0,
                 reqid: int = 1) -> bytes:
    return (struct.pack("<IHHQQQ", MAGIC, 2, 2, addr, n, reqid)
            + struct.pack("<QQQQII", word, floor, lo, hi, wait_ms, reserved))


def plain_read(addr: int, n: int, reqid: int = 9) -> bytes:
    return struct.pack("<IHHQQQ", MAGIC, 2, 0, addr, n, reqid)



def answer(c: socket.socket, n: int) -> tuple[int, int, bytes]:
    """(status, request id, payload) of one answer to a READ of n bytes."""
    h = recv_upto(c, 24)
    assert len(h) == 24 and struct.unpack_from("<I", h)[0] == MAGIC, h
    status, reqid = struct.unpack_from("<i", h, 8)[0], struct.unpack_from("<Q", h, 16)[0]
    gap = struct.unpack_from("<H", h, 6)[0]
    body = recv_upto(c, gap + n)[gap:] if status == OK else b""
    return status, reqid, body


def _nothing_yet(c: socket.socket, wait_s: float) -> bool:
    c.settimeout(wait_s)
    try:
        return c.recv(1, socket.MSG_PEEK) == b""  # b"": closed (not "nothing yet")
    except TimeoutError:
        return True
    finally:
        c.settimeout(10)


def test_answered_only_once_the_word_covers_the_range(srv: Server) -> None:
    ro = pattern(REGIONS["ro"][2], REGIONS["ro"][0]).tobytes()
    word = srv.addr("rw")
    c = _connect(srv)
    c.sendall(waiting_read(srv.addr("ro") + 4096, 65536, word, V, V | 100, V | 0xFFFFFFFFFF, 5000, reqid=5))
    assert _nothing_yet(c, 0.3)  # the word says 10 bytes: parked
    srv.cmd(cmd="poke", region="rw", off=0, value=V | 99)
    assert _nothing_yet(c, 0.2)  # still short of 100
    assert srv.cmd(cmd="stats")["parked"] == 1
    srv.cmd(cmd="poke", region="rw", off=0, value=V | 100)
    assert answer(c, 65536) == (OK, 5, ro[4096:4096 + 65536])
    # the same connection serves on; a word already in range answers at once
    c.sendall(waiting_read(srv.addr("ro"), 16, word, V, V | 50, V | 0xFFFFFFFFFF, 5000, reqid=6))
    assert answer(c, 16) == (OK, 6, ro[:16])
    st = srv.cmd(cmd="stats")
    assert st["parked"] == 0 and st["waits_served"] == 1
    c.close()


def test_fails_at_its_deadline_or_when_the_word_leaves_the_range(srv: Server) -> None:
    word = srv.addr("rw")
    c = _connect(srv)
    t0 = time.monotonic()
    c.sendall(waiting_read(srv.addr("ro"), 4096, word, V, V | 100, V | 0xFFFFFFFFFF, 150, reqid=11))
    assert answer(c, 4096) == (E_NOT_READY, 11, b"")
    assert time.monotonic() - t0 >= 0.14  # not before its deadline
    # the word drops below the floor (the source reset its copy) while parked: fails without the deadline
    c.sendall(waiting_read(srv.addr("ro"), 4096, word, V, V | 100, V | 0xFFFFFFFFFF, 60_000, reqid=12))
    assert _nothing_yet(c, 0.2)
    srv.cmd(cmd="poke", region="rw", off=0, value=0)
    assert answer(c, 4096) == (E_NOT_READY, 12, b"")
    # above hi (another version) or below floor at arrival: at once
    srv.cmd(cmd="poke", region="rw", off=0, value=(8 << 40) | 5)
    c.sendall(waiting_read(srv.addr("ro"), 8, word, V, V | 1, V | 0xFFFFFFFFFF, 60_000, reqid=13))
    assert answer(c, 8) == (E_NOT_READY, 13, b"")
    c.sendall(plain_read(srv.addr("ro"), 8))  # the connection goes on
    assert answer(c, 8)[0] == OK
    assert srv.cmd(cmd="stats")["waits_not_ready"] >= 3
    c.close()


@pytest.mark.parametrize("bad", [
    {"word_off": 3},                      # not 8-byte aligned
    {"floor": V | 200},                   # floor > lo
    {"hi": V | 50},                       # lo > hi
    {"wait_ms": 0},
    {"reserved": 1},
])
def test_a_malformed_condition_is_refused_and_the_connection_goes_on(srv: Server, bad: dict[str, int]) -> None:
    ro = pattern(REGIONS["ro"][2], REGIONS["ro"][0]).tobytes()
    c = _connect(srv)
    c.sendall(waiting_read(srv.addr("ro"), 64, srv.addr("rw") + bad.get("word_off", 0), bad.get("floor", V), V | 100,
                           bad.get("hi", V | 0xFFFFFFFFFF), bad.get("wait_ms", 5000), bad.get("reserved", 0), reqid=21))
    assert answer(c, 64) == (E_PROTOCOL, 21, b"")
    c.sendall(plain_read(srv.addr("ro"), 64))
    assert answer(c, 64) == (OK, 9, ro[:64])
    c.close()


def test_the_word_and_the_range_are_checked_like_any_read(srv: Server) -> None:
    cover = (V, V | 1, V | 0xFFFFFFFFFF)
    c = _connect(srv)
    cases = [
        (srv.addr("ro"), srv.addr("wo"), E_PERMISSION),    # word in a write-only region
        (srv.addr("ro"), srv.addr("none"), E_PERMISSION),  # ... in a region without remote access
        (srv.addr("ro"), 8, E_BOUNDS),                      # ... outside every region
        (srv.addr("wo"), srv.addr("rw"), E_PERMISSION),    # the data is not readable
        (srv.addr("ro") + REGIONS["ro"][0] - 8, srv.addr("rw"), E_BOUNDS),  # ... nor inside its region
    ]
    for i, (data, word, status) in enumerate(cases):
        c.sendall(waiting_read(data, 64, word & ~7, *cover, 5000, reqid=30 + i))
        assert answer(c, 64) == (status, 30 + i, b""), (i, data, word)
    c.close()


def test_parked_reads_are_bounded(srv: Server) -> None:  # wait_max_parked=2
    ro = pattern(REGIONS["ro"][2], REGIONS["ro"][0]).tobytes()
    word = srv.addr("rw")
    conns = [_connect(srv) for _ in range(3)]
    for i, c in enumerate(conns[:2]):
        c.sendall(waiting_read(srv.addr("ro"), 32, word, V, V | 1000, V | 0xFFFFFFFFFF, 30_000, reqid=40 + i))
    deadline = time.monotonic() + 10
    while srv.cmd(cmd="stats")["parked"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    conns[2].sendall(waiting_read(srv.addr("ro"), 32, word, V, V | 1000, V | 0xFFFFFFFFFF, 30_000, reqid=42))
    assert answer(conns[2], 32) == (E_NOT_READY, 42, b"")  # a third is not parked
    assert srv.cmd(cmd="stats")["waits_refused"] >= 1
    srv.cmd(cmd="poke", region="rw", off=0, value=V | 1000)
    for i, c in enumerate(conns[:2]):
        assert answer(c, 32) == (OK, 40 + i, ro[:32])
    for c in conns:
        c.close()


def test_unregister_ends_a_parked_read_without_cutting_it(srv: Server) -> None:
    c = _connect(srv)
    rid = srv.cmd(cmd="register", region="ro", perm=1)["id"]  # a second registration, removed below
    srv.cmd(cmd="unregister", region="ro")  # the first one: the second still covers the bytes
    c.sendall(waiting_read(srv.addr("ro"), 32, srv.addr("rw"), V, V | 1000, V | 0xFFFFFFFFFF, 30_000, reqid=50))
    assert _nothing_yet(c, 0.2)
    out = srv.cmd(cmd="unregister_id", id=rid, timeout_s=10.0)
    assert out["ok"]
    assert answer(c, 32) == (E_NOT_READY, 50, b"")
    assert srv.cmd(cmd="stats")["cut"] == 0
    c.close()
