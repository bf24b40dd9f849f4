"""QoS: the threads moving bulk (the client's sending worker, the target's receiving connection
thread) run at `qos_bulk_nice` while small requests are active, and at their own weight otherwise
(the policy as a pure function; the mechanics read back from /proc, both processes)."""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np
import pytest
from tcp_helpers import READ, WRITE, Server, TcpExecutor, connect, pattern, run, submit, wait_result
from tent_tcp.native import qos_bulk_level

from tent_core.abi import HINT_SMALL

SCHED_OTHER, SCHED_IDLE = 0, 5


def test_policy_demotes_bulk_only_while_small_requests_are_active() -> None:
    for knob in (1, 19, 20):
        assert qos_bulk_level(knob, True, 100, 105) == knob  # window open
        assert qos_bulk_level(knob, True, 105, 105) == 0  # ... closed at its end
        assert qos_bulk_level(knob, True, 100, 0) == 0  # no small request ever
        assert qos_bulk_level(knob, False, 100, 105) == 0  # small work: never demoted
    assert qos_bulk_level(0, True, 100, 105) == 0  # off
    assert qos_bulk_level(21, True, 100, 105) == 0  # out of range: off


def _levels(pid: int) -> dict[int, tuple[int, int]]:
    """tid -> (nice, policy) of every thread of `pid` (proc(5): fields 19 and 41)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread just ended
            continue
        out[int(tid)] = (int(rest[16]), int(rest[38]))
    return out


def _demoted(pid: int, knob: int) -> bool:
    want = (knob, SCHED_OTHER) if knob < 20 else (0, SCHED_IDLE)
    return want in _levels(pid).values()


def _all_own(pid: int) -> bool:
    return all(lv == (0, SCHED_OTHER) for lv in _levels(pid).values())


def _eventually(cond: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.002)
    return False


@pytest.mark.skipif(os.nice(0) != 0, reason="the test process must run at nice 0")
@pytest.mark.parametrize(("knob", "serve"), [(19, 1), (20, 1), (19, 0)])
def test_bulk_threads_run_demoted_while_small_requests_are_active_and_as_themselves_after(
    knob: int, serve: int
) -> None:
    """`serve` 0: only the initiator demotes (qos_serve_nice): the target's threads never move."""
    window_ms = 1500
    cfg = {
        "threads": 3,
        "conns_per_rail": 1,
        "slice_timeout_ms": 30000,
        "qos_bulk_nice": knob,
        "qos_window_ms": window_ms,
        "qos_serve_nice": serve,
    }
    server = Server(config=";".join(f"{k}={v}" for k, v in cfg.items()))
    ex = TcpExecutor(cfg)
    try:
        if ex.qos_bulk_nice() != knob:
            pytest.skip("this process may not undo a demotion (CAP_SYS_NICE / RLIMIT_NICE)")
        spid, cpid = server.proc.pid, os.getpid()
        assert _all_own(spid) and _all_own(cpid)
        peer = connect(ex, server)
        rw = server.addr("rw")
        dst = np.zeros(4096, np.uint8)
        chunk = 1 << 20
        seen = {"client": False, "server": False}
        want = {"client": True, "server": bool(serve)}
        deadline = time.monotonic() + 30.0
        src = pattern(610, 16 * chunk)
        while seen != want and time.monotonic() < deadline:
            res = run(ex, [(READ, dst.ctypes.data, rw, 4096, peer, 0)], hints=HINT_SMALL)  # both windows open
            assert res.done and res.error == 0, res
            b, t0 = submit(
                ex, [(WRITE, src.ctypes.data + i * chunk, rw + i * chunk, chunk, peer, 0) for i in range(16)]
            )
            while b.remaining and time.monotonic() < deadline:  # type: ignore[attr-defined]
                seen["client"] = seen["client"] or _demoted(cpid, knob)
                seen["server"] = seen["server"] or _demoted(spid, knob)
            assert wait_result(b, t0, 60.0).error == 0
        assert seen == want  # serve 0: the target's threads never moved while the client's did
        assert server.sha("rw", 0, 16 * chunk) == _sha(src)
        # the client's workers go idle: each back to its own weight at once
        assert _eventually(lambda: _all_own(cpid), 10.0), _levels(cpid)

        time.sleep(window_ms / 1000 + 0.2)  # no small request since: both windows closed
        src2 = pattern(611, 16 * chunk)
        b, t0 = submit(ex, [(WRITE, src2.ctypes.data + i * chunk, rw + i * chunk, chunk, peer, 0) for i in range(16)])
        assert wait_result(b, t0, 60.0).error == 0
        assert server.sha("rw", 0, 16 * chunk) == _sha(src2)
        # bulk without small requests runs at full weight: its threads moved back at its first request
        assert _eventually(lambda: _all_own(spid) and _all_own(cpid), 10.0), (_levels(spid), _levels(cpid))
    finally:
        ex.close()
        server.close()


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(a.tobytes()).hexdigest()
