"""QoS pieces: while small requests are active, the demoted threads moving bulk (both sides) move
their bytes `qos_bulk_piece` at a time and yield the core between two; bulk alone moves in whole
calls (the policy as a pure function; the mechanics counted by both executors, the bytes checked)."""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np
import pytest
from tcp_helpers import READ, WRITE, Server, TcpExecutor, connect, pattern, run, submit, wait_result
from tent_tcp.native import qos_piece

from tent_core.abi import HINT_SMALL

MiB = 1 << 20


def test_policy_cuts_calls_to_pieces_only_when_set() -> None:
    assert qos_piece(128 << 10, MiB) == 128 << 10
    assert qos_piece(128 << 10, 100) == 100  # shorter than a piece: whole
    assert qos_piece(128 << 10, 128 << 10) == 128 << 10
    assert qos_piece(0, MiB) == MiB  # off: whole calls
    assert qos_piece(1, 5) == 1


def test_a_piece_below_a_page_is_refused() -> None:
    from tent_core.errors import PluginABIError

    for bad in (1, 4095, "many"):
        with pytest.raises(PluginABIError, match="qos_bulk_piece"):
            TcpExecutor({"qos_bulk_piece": bad})
    for ok in (0, 4096):
        TcpExecutor({"qos_bulk_piece": ok}).close()


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
