"""engine.submit_when over tcp (Transport.wait_read): a READ posted before its bytes are there is
answered once the target's word covers it, with the bytes written before the word; it fails with
NotReadyError at its wait's end; the engine refuses conditions it cannot honour. Two real engines
on loopback."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from tcp_helpers import engine_pair

from tent_core import READ, WRITE, InvalidRequestError, NotReadyError, Request, WaitWord
from tent_core.engine import Engine
from tent_core.testing import pattern

V = 3 << 40
MASK = (1 << 40) - 1




@pytest.fixture
def pair(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Engine, Engine]]:
    yield from engine_pair(monkeypatch)


def _word(buf: Any) -> np.ndarray:
    return buf.array[:8].view(np.uint64)


def test_reads_posted_ahead_land_as_the_word_advances(pair: tuple[Engine, Engine]) -> None:
    a, b = pair  # a: the source, filling its copy piece by piece; b: reads it ahead of the word
    n, piece = 8 << 20, 1 << 20
    src = a.allocate(n)
    src.array[:] = 0
    ctrl = a.allocate(64)
    _word(ctrl)[0] = V
    dst = b.allocate(n)
    dst.array[:] = 0xEE
    remote = f"{a.engine_id}/default"
    assert b.can_wait(remote)
    want = pattern(n, 11)
    reqs = [Request(READ, dst, k, remote, src.offset + k, piece) for k in range(0, n, piece)]
    waits = [WaitWord(ctrl.offset, V, V | (k + piece), V | MASK, timeout_s=5.0) for k in range(0, n, piece)]
    h = b.submit_when(reqs, waits, 30.0)
    time.sleep(0.2)
    assert not h.poll() == "done"  # nothing held yet
    assert h.bytes_done == 0

    def fill() -> None:  # the source's own bytes land, then its word says so
        for k in range(0, n, piece):
            src.array[k:k + piece] = want[k:k + piece]
            _word(ctrl)[0] = V | (k + piece)
            time.sleep(0.01)

    t = threading.Thread(target=fill)
    t.start()
    h.wait()
    t.join()
    assert np.array_equal(dst.array[:n], want)


def test_not_ready_at_the_end_of_its_wait(pair: tuple[Engine, Engine]) -> None:
    a, b = pair
    src, ctrl, dst = a.allocate(4096), a.allocate(64), b.allocate(4096)
    _word(ctrl)[0] = V | 100
    remote = f"{a.engine_id}/default"
    h = b.submit_when([Request(READ, dst, 0, remote, src.offset, 4096)], [WaitWord(ctrl.offset, V, V | 4096, V | MASK, 0.1)], 10.0)
    with pytest.raises(NotReadyError):
        h.wait()
    # a plain request and a condition already met go through alongside
    b.submit_when([Request(READ, dst, 0, remote, src.offset, 64), Request(READ, dst, 64, remote, src.offset + 64, 36)],
                  [None, WaitWord(ctrl.offset, V, V | 100, V | MASK)], 10.0).wait()


def test_conditions_it_cannot_honour_are_refused(pair: tuple[Engine, Engine]) -> None:
    a, b = pair
    src, ctrl, dst = a.allocate(4096), a.allocate(64), b.allocate(4096)
    remote = f"{a.engine_id}/default"
    r = Request(READ, dst, 0, remote, src.offset, 64)
    good = WaitWord(ctrl.offset, V, V | 1, V | MASK)
    for bad in (WaitWord(ctrl.offset + 4, V, V | 1, V | MASK), WaitWord(ctrl.offset, V | 2, V | 1, V | MASK),
                WaitWord(ctrl.offset, V, V | 1, V | MASK, timeout_s=0)):
        with pytest.raises(InvalidRequestError):
            b.submit_when([r], [bad])
    with pytest.raises(InvalidRequestError):
        b.submit_when([Request(WRITE, dst, 0, remote, src.offset, 64)], [good])
    with pytest.raises(InvalidRequestError):
        b.submit_when([r, r], [good])


class _Slice(ctypes.Structure):
    _fields_ = [("local_addr", ctypes.c_uint64), ("remote_addr", ctypes.c_uint64), ("length", ctypes.c_uint64),
                ("peer", ctypes.c_uint64), ("token", ctypes.c_uint64), ("submit_ns", ctypes.c_uint64),
                ("opcode", ctypes.c_uint32), ("rail", ctypes.c_uint32), ("stat_index", ctypes.c_uint32),
                ("attempt", ctypes.c_uint32)]


class _Wait(ctypes.Structure):
    _fields_ = [("local_start", ctypes.c_uint64), ("local_end", ctypes.c_uint64), ("word_addr", ctypes.c_uint64),
                ("floor", ctypes.c_uint64), ("lo", ctypes.c_uint64), ("hi", ctypes.c_uint64),
                ("wait_ms", ctypes.c_uint32), ("reserved", ctypes.c_uint32)]


_WAIT_FN = ctypes.CFUNCTYPE(ctypes.POINTER(_Wait), ctypes.c_void_p, ctypes.POINTER(_Slice))


class _Host(ctypes.Structure):
    _fields_ = [("abi_version", ctypes.c_uint32), ("struct_size", ctypes.c_uint32), ("ctx", ctypes.c_void_p),
                ("complete", ctypes.c_void_p), ("is_cancelled", ctypes.c_void_p), ("note", ctypes.c_void_p),
                ("digest", ctypes.c_void_p), ("wait", _WAIT_FN)]


def test_the_batch_keeps_its_conditions_for_a_retry_on_another_thread(pair: tuple[Engine, Engine]) -> None:
    """A slice the core re-issues (recovery, its own thread) must still wait at the target: the
    conditions live in the batch, not in the submitting thread's arm."""
    from tent_core import _native

    a, b = pair
    src, ctrl, dst = a.allocate(4096), a.allocate(64), b.allocate(4096)
    _word(ctrl)[0] = V
    remote = f"{a.engine_id}/default"
    h = b.submit_when([Request(READ, dst, 0, remote, src.offset, 4096)], [WaitWord(ctrl.offset, V, V | 4096, V | MASK, 5.0)],
                      10.0)
    host = _Host.from_address(_native.host_api_address())
    assert host.struct_size >= ctypes.sizeof(_Host)
    got: list[Any] = []

    def elsewhere() -> None:  # a thread that armed nothing, as the core's retry thread
        s = _Slice(local_addr=dst.addr + 100, length=8, token=h.token, opcode=0)
        w = host.wait(None, ctypes.byref(s))
        got.append((w.contents.lo, w.contents.hi, w.contents.floor, w.contents.local_start) if w else None)
        s2 = _Slice(local_addr=dst.addr + 4096, length=8, token=h.token, opcode=0)  # outside the request
        got.append(bool(host.wait(None, ctypes.byref(s2))))

    t = threading.Thread(target=elsewhere)
    t.start()
    t.join()
    assert got == [(V | 4096, V | MASK, V, dst.addr), False]
    _word(ctrl)[0] = V | 4096
    h.wait()


@pytest.mark.parametrize("wait_conns", [2, 4])
def test_waiting_reads_take_at_most_wait_conns_connections(monkeypatch: pytest.MonkeyPatch, wait_conns: int) -> None:
    """Each connection parks one waiting READ at a time (the rest wait behind it, in order): the
    READs parked at the target at once are the connections the initiator gives them."""
    # a progress timeout long enough that the initiator lets them wait (it caps a
    # READ's wait at half of it)
    engines = engine_pair(monkeypatch, {"slice_timeout_s": 5.0}, wait_conns=wait_conns)
    a, b = next(engines)
    try:
        src, ctrl, dst = a.allocate(4 << 20), a.allocate(64), b.allocate(4 << 20)
        _word(ctrl)[0] = V
        remote = f"{a.engine_id}/default"
        piece = 256 << 10  # small requests: pipelined runs
        reqs = [Request(READ, dst, k, remote, src.offset + k, piece) for k in range(0, 4 << 20, piece)]
        waits = [WaitWord(ctrl.offset, V, V | (k + piece), V | MASK, 5.0) for k in range(0, 4 << 20, piece)]
        h = b.submit_when(reqs, waits, 30.0)
        stats = a.transports["tcp"]._exec.server_stats  # type: ignore[attr-defined]
        seen, t_end = 0, time.monotonic() + 0.4  # the target parks one 1 s at most (wait_max_ms)
        while time.monotonic() < t_end:
            seen = max(seen, stats()["parked"])
            time.sleep(0.005)
        assert seen == wait_conns
        _word(ctrl)[0] = V | (4 << 20)
        h.wait()
        assert stats()["parked"] == 0 and stats()["waits_served"] >= wait_conns
    finally:
        next(engines, None)
