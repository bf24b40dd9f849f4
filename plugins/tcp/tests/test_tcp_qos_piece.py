"""QoS pieces: while small requests are active, the demoted threads moving bulk (both sides) move
their bytes `qos_bulk_piece` at a time and yield the core between two; bulk alone moves in whole
calls of at most 256 KiB, looking between two for small requests that started meanwhile (the policy
as a pure function; the mechanics counted by both executors, the bytes checked)."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator

import numpy as np
import pytest
from tcp_helpers import READ, WRITE, Server, TcpExecutor, connect, pattern, run, submit, wait_result
from tent_tcp.native import qos_call_bytes

from tent_core.abi import HINT_SMALL, StatField
from tent_core.rails import RAILS
from tent_core.types import RailInfo

MiB = 1 << 20


def test_policy_cuts_calls_to_pieces_while_demoted_and_to_watch_steps_at_full_weight() -> None:
    piece = 128 << 10
    assert qos_call_bytes(True, False, piece, MiB) == piece
    assert qos_call_bytes(True, False, piece, 100) == 100  # shorter than a piece: whole
    assert qos_call_bytes(True, False, piece, piece) == piece
    assert qos_call_bytes(True, False, 0, MiB) == MiB  # pieces off: whole calls
    assert qos_call_bytes(False, True, piece, MiB) == 256 << 10  # full weight, watching
    assert qos_call_bytes(False, True, piece, 1000) == 1000
    assert qos_call_bytes(False, False, piece, MiB) == MiB  # neither (small work, QoS off): whole
    assert qos_call_bytes(True, True, 1, 5) == 1  # demoted wins


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(a.tobytes()).hexdigest()


@pytest.mark.skipif(os.nice(0) != 0, reason="the test process must run at nice 0")
@pytest.mark.parametrize("op", [WRITE, READ])
@pytest.mark.parametrize("piece", [3 * 4096 + 13, 0])
def test_bulk_moves_in_pieces_while_small_requests_are_active_and_whole_after(op: int, piece: int) -> None:
    """A piece that is no multiple of anything on the wire (header, gap, page) cuts every kind of
    entry of a bulk request's calls (WRITE: the client's header, gap and payload, the target's
    gap and payload; READ: the target's answer header, gap and payload, the client's payload);
    the bytes must come through intact either way. `piece` 0: off, no yields at all."""
    window_ms = 1500
    cfg = {
        "threads": 3,
        "conns_per_rail": 1,
        "slice_timeout_ms": 30000,
        "qos_bulk_nice": 19,
        "qos_bulk_piece": piece,
        "qos_window_ms": window_ms,
    }
    server = Server(config=";".join(f"{k}={v}" for k, v in cfg.items()))
    ex = TcpExecutor(cfg)
    try:
        if ex.qos_bulk_nice() != 19:
            pytest.skip("this process may not undo a demotion (CAP_SYS_NICE / RLIMIT_NICE)")
        peer = connect(ex, server)
        rw = server.addr("rw")
        small = np.zeros(4096, np.uint8)
        n = 8

        def bulk(seed: int) -> None:
            if op == WRITE:
                src = pattern(seed, n * MiB)
                slices = [(WRITE, src.ctypes.data + i * MiB, rw + i * MiB, MiB, peer, 0) for i in range(n)]
            else:
                server.cmd(cmd="fill", region="rw", seed=seed)
                dst = np.zeros(n * MiB, np.uint8)
                slices = [(READ, dst.ctypes.data + i * MiB, rw + i * MiB, MiB, peer, 0) for i in range(n)]
            b, t0 = submit(ex, slices)
            assert wait_result(b, t0, 60.0).error == 0
            if op == WRITE:
                assert server.sha("rw", 0, n * MiB) == _sha(src)
            else:
                assert _sha(dst) == _sha(pattern(seed, 16 * MiB)[: n * MiB])

        def yields() -> tuple[int, int]:
            return ex.qos_yields(), int(server.cmd(cmd="stats")["qos_yields"])

        res = run(ex, [(READ, small.ctypes.data, rw, 4096, peer, 0)], hints=HINT_SMALL)  # both windows open
        assert res.done and res.error == 0, res
        bulk(620)
        during = yields()
        if piece:
            # the side sending the payload cuts every MiB into ~85 pieces, the receiving side too
            # (a receive may come short of its piece when the bytes are not all there yet: >= not ==)
            assert during[0] >= n * (MiB // piece - 1) and during[1] >= n * (MiB // piece - 1), during
        else:
            assert during == (0, 0)

        time.sleep(window_ms / 1000 + 0.2)  # no small request since: both windows closed
        bulk(621)
        assert yields() == during  # bulk alone: whole calls on both sides
    finally:
        ex.close()
        server.close()


@pytest.fixture
def rail_slot() -> Iterator[int]:
    """A row of the process's rail table: the client's payload bytes handed to the kernel count there."""
    rail = RAILS.acquire("test-qos-piece", "peer", RailInfo(index=0, name="qos"))
    yield rail.stat_index
    RAILS.release(rail)


@pytest.mark.skipif(os.nice(0) != 0, reason="the test process must run at nice 0")
def test_bulk_in_flight_demotes_itself_when_small_requests_start(rail_slot: int) -> None:
    """One 16 MiB WRITE (one request, whose level both sides decided at its start, with no small
    request active) and, once its first 4 MiB left (socket buffers of 512 KiB: the target's thread
    is receiving it, so read its header before), a small READ: both sides' threads moving the WRITE
    must start yielding before it ends (they look between calls of 256 KiB), its bytes intact."""
    window_ms = 300
    cfg = {"threads": 3, "conns_per_rail": 1, "slice_timeout_ms": 30000, "qos_bulk_nice": 19,
           "qos_window_ms": window_ms, "sockbuf": 256 << 10}  # fmt: skip
    server = Server(config=";".join(f"{k}={v}" for k, v in cfg.items()))
    ex = TcpExecutor(cfg)
    try:
        if ex.qos_bulk_nice() != 19:
            pytest.skip("this process may not undo a demotion (CAP_SYS_NICE / RLIMIT_NICE)")
        peer = connect(ex, server)
        rw = server.addr("rw")
        small = np.zeros(4096, np.uint8)
        n = 16 * MiB
        warm = pattern(630, n)  # both connections open
        assert run(ex, [(READ, small.ctypes.data, rw, 4096, peer, 0)], hints=HINT_SMALL).error == 0
        assert run(ex, [(WRITE, warm.ctypes.data, rw, n, peer, 0)], timeout=60.0).error == 0
        row = RAILS.row(rail_slot)
        counted = 0
        for attempt in range(20):  # an attempt counts when 2 MiB or more were still to go after the small READ
            time.sleep(window_ms / 1000 + 0.1)  # both windows closed: the WRITE starts at full weight
            before = (ex.qos_yields(), int(server.cmd(cmd="stats")["qos_yields"]))
            src = pattern(631 + attempt, n)
            moved0 = int(row[StatField.BYTES_MOVED])
            b, t0 = submit(ex, [(WRITE, src.ctypes.data, rw, n, peer, 0)], stat_index=rail_slot)
            deadline = time.monotonic() + 30.0
            while int(row[StatField.BYTES_MOVED]) - moved0 < 4 * MiB and time.monotonic() < deadline:
                pass
            assert run(ex, [(READ, small.ctypes.data, rw, 4096, peer, 0)], hints=HINT_SMALL).error == 0
            left = n - (int(row[StatField.BYTES_MOVED]) - moved0)
            assert wait_result(b, t0, 60.0).error == 0
            assert server.sha("rw", 0, n) == _sha(src)
            if left < 2 * MiB:
                continue  # the host was too slow for this attempt to tell anything
            after = (ex.qos_yields(), int(server.cmd(cmd="stats")["qos_yields"]))
            assert after[0] > before[0] and after[1] > before[1], (before, after, left)
            counted += 1
            if counted == 3:
                break
        assert counted, "no attempt had the small READ answered while 2 MiB of the WRITE were still to go"
    finally:
        ex.close()
        server.close()
