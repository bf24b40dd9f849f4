"""Issue 12: a request fails only at its deadline or when no path can ever serve it; dead peers are
remembered (new requests fail fast) until they answer again; a silent peer is detected within the
deadline like a killed one.

The state machine (`tent_core.liveness`) is tested with literals; the engine tests use real peer
processes over loopback TCP (killed with SIGKILL, stopped with SIGSTOP, restarted on the same
control port) and, for paths that fail for a while, the fault executor around the real TCP
transport (the bytes still move over real sockets).
"""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest
from peers import Peer, sha

from tent_core import (
    READ,
    WRITE,
    CancelledError,
    DeadlineExceededError,
    Engine,
    PeerSilentError,
    PeerUnreachableError,
    Request,
)
from tent_core.abi import Status
from tent_core.config import PeerConfig
from tent_core.liveness import CheckResult, PeerLiveness, PeerState
from tent_core.testing import TENT_E_CONNECT, FaultPlugin, pattern

RAILS2 = {"rails": ["127.0.0.1", "127.0.0.2"]}
E_CONNECT, E_TIMEOUT = int(Status.E_CONNECT), int(Status.E_TIMEOUT)


# ---- the state machine ----------------------------------------------------------------------------


def test_liveness_silent_then_refused_is_dead_until_answered():
    lv = PeerLiveness("h:1", PeerConfig(check_backoff_base_s=0.1, check_backoff_cap_s=0.4))
    assert lv.state is PeerState.ALIVE and not lv.check_due(0.0) and lv.fail_fast(0.0) is None
    out = lv.on_no_path(1.0, "tcp rail 0", E_CONNECT)
    lv.on_no_path(1.0, "tcp rail 1", E_CONNECT)
    assert lv.state is PeerState.SILENT and lv.fail_fast(1.0) is None  # requests still wait
    assert lv.check_due(1.0) and not lv.check_due(1.0)  # one check at a time
    lv.on_check(1.05, CheckResult.REFUSED, "connect refused")
    assert lv.dead and "gone" in lv.fail_fast(1.1) and lv.ends_waiting(1.1) == lv.fail_fast(1.1)
    assert "tcp rail 0: E_CONNECT x1" in lv.fail_fast(1.1) and "requests fail at once" in lv.fail_fast(1.1)
    # re-checked with back-off (0.1, 0.2, 0.4, 0.4 ...) while dead
    assert not lv.check_due(1.1) and lv.check_due(1.16)
    lv.on_check(1.2, CheckResult.REFUSED)
    assert not lv.check_due(1.35) and lv.check_due(1.41)
    lv.on_check(1.45, CheckResult.ANSWERED, "pid 7")  # restarted
    assert lv.state is PeerState.ALIVE and lv.fail_fast(1.5) is None
    assert out.ongoing  # the paths have not moved a byte yet
    lv.on_progress(1.6)
    assert not out.ongoing and lv.outage is None


def test_liveness_deadline_on_a_silent_peer_marks_it_dead_unless_it_answered():
    lv = PeerLiveness("h:1")
    lv.on_no_path(0.0, "tcp rail 0", E_TIMEOUT)
    assert lv.check_due(0.0)
    lv.on_check(0.5, CheckResult.NO_ANSWER, "no answer to 'describe' within 0.5s")
    assert lv.state is PeerState.SILENT
    lv.on_deadline(4.0)
    assert lv.dead and "silent for 4.00s" in lv.fail_fast(4.0)
    assert "control endpoint: no answer" in lv.fail_fast(4.0)
    # new requests fail at once, but requests already waiting keep waiting for their own deadlines:
    # one request's short deadline must not fail another's long one while the peer may still return
    assert lv.ends_waiting(4.0) is None
    assert lv.check_due(4.5)
    lv.on_check(4.6, CheckResult.REFUSED, "connect refused")  # now it is gone: they end too
    assert "process is gone" in lv.ends_waiting(4.7)
    # a peer that answers on its control port while its data paths fail is not declared dead
    lv2 = PeerLiveness("h:2")
    lv2.on_no_path(0.0, "tcp rail 0", E_CONNECT)
    lv2.check_due(0.0)
    lv2.on_check(0.1, CheckResult.ANSWERED)
    lv2.on_no_path(0.2, "tcp rail 0", E_CONNECT)
    lv2.on_deadline(4.0)
    assert not lv2.dead


def test_outage_says_what_was_tried_and_for_how_long():
    lv = PeerLiveness("h:1")
    o = lv.on_no_path(10.0, "tcp rail 1", E_CONNECT)
    for _ in range(3):
        lv.on_no_path(10.5, "tcp rail 0", E_TIMEOUT)
    lv.on_retry_round(0.04)
    lv.on_retry_round(0.08)
    text = o.describe(12.5)
    assert "no path to engine h:1 for 2.50s" in text
    assert "tcp rail 0: E_TIMEOUT x3" in text and "tcp rail 1: E_CONNECT x1" in text
    assert "2 retry round(s), back-off up to 0.08s" in text


# ---- engines and real peer processes --------------------------------------------------------------


def test_killed_peer_fails_fast_is_remembered_and_used_again_after_restart():
    peer = Peer(size=16 << 20, config={"transports": {"tcp": RAILS2}})
    port = int(peer.engine_id.rsplit(":", 1)[1])
    restarted = None
    try:
        with Engine({"transports": {"tcp": RAILS2}}, transports=["tcp"]) as eng:
            local = eng.allocate(16 << 20)
            eng.read(local, peer.seg("ro"), 1 << 20)
            inflight = eng.submit([Request(READ, local, 0, peer.seg("ro"), 0, 16 << 20)] * 64, deadline=30)
            assert inflight.poll() == "pending"
            peer.kill()
            t0 = time.monotonic()
            with pytest.raises(PeerUnreachableError, match="gone") as err:
                inflight.wait()
            assert not isinstance(err.value, PeerSilentError)  # a typed error at once, not at the deadline
            assert time.monotonic() - t0 < 15, time.monotonic() - t0  # half the 30 s deadline: room for a loaded box
            # remembered: new requests fail at once with the reason (the text comes only from the
            # fail-fast path; without it they would wait for their 30 s deadline)
            for _ in range(3):
                t1 = time.monotonic()
                with pytest.raises(PeerUnreachableError, match="requests fail at once"):
                    eng.submit([Request(READ, local, 0, peer.seg("ro"), 0, 1 << 20)], deadline=30).wait()
                assert time.monotonic() - t1 < 2.0
            # the peer comes back on the same control port: used again once a check sees it
            restarted = Peer(size=16 << 20, config={"transports": {"tcp": RAILS2}}, port=port)
            assert restarted.engine_id == peer.engine_id
            end = time.monotonic() + 15
            while True:
                try:
                    eng.read(local, restarted.seg("ro"), 8 << 20, timeout=10)
                    break
                except PeerUnreachableError:
                    assert time.monotonic() < end, "the restarted peer was never used again"
                    time.sleep(0.05)
            assert np.array_equal(local.array[: 8 << 20], pattern(16 << 20, seed=1)[: 8 << 20])
    finally:
        peer.close()
        if restarted is not None:
            restarted.close()


def test_stopped_peer_is_a_typed_error_at_the_deadline_then_fails_fast_then_returns():
    peer = Peer(size=16 << 20, config={"transports": {"tcp": RAILS2}})
    try:
        with Engine({"transports": {"tcp": RAILS2}}, transports=["tcp"]) as eng:
            local = eng.allocate(16 << 20)
            eng.read(local, peer.seg("ro"), 1 << 20)
            peer.stop()  # alive, silent: no socket error, no byte moves
            t0 = time.monotonic()
            with pytest.raises(PeerSilentError) as err:
                eng.submit([Request(READ, local, 0, peer.seg("ro"), 0, 16 << 20)], deadline=3.0).wait()
            took = time.monotonic() - t0
            assert 2.9 < took < 6.0, took  # at the deadline, not before (the upper bound: no hang)
            assert isinstance(err.value, DeadlineExceededError) and "tried tcp rail" in str(err.value)
            # the deadline told the engine the peer is silent: later requests fail at once
            time.sleep(0.1)  # the parked slices are finalized by the next health tick
            t1 = time.monotonic()
            with pytest.raises(PeerUnreachableError, match="silent for"):
                eng.submit([Request(READ, local, 0, peer.seg("ro"), 0, 1 << 20)], deadline=30).wait()
            assert time.monotonic() - t1 < 2.0  # far from the 30 s deadline it would otherwise wait for
            peer.proc.send_signal(signal.SIGCONT)
            end = time.monotonic() + 15
            while True:
                try:
                    eng.read(local, peer.seg("ro"), 16 << 20, timeout=10)
                    break
                except PeerUnreachableError:
                    assert time.monotonic() < end, "the peer was never used again after SIGCONT"
                    time.sleep(0.05)
            assert np.array_equal(local.array, pattern(16 << 20, seed=1))
    finally:
        peer.proc.send_signal(signal.SIGCONT)
        peer.close()


@pytest.fixture(scope="module")
def ro_peer():
    p = Peer(size=64 << 20, config={"transports": {"tcp": RAILS2}})
    yield p
    p.close()


def test_every_path_failing_for_a_second_inside_the_deadline_loses_nothing(ro_peer):
    """Connection failures on every rail for 1 s (as when all links drop): the requests wait and
    are retried with back-off, then complete; no application error."""
    fp = FaultPlugin("tcp")
    with Engine({"transports": {"faulty_tcp": RAILS2}}, plugins=[fp], transports=["faulty_tcp"]) as eng:
        local = eng.allocate(64 << 20)
        eng.read(local, ro_peer.seg("ro"), 1 << 20)
        local.array[:] = 0
        fp.instances["tcp"].inject(TENT_E_CONNECT)
        healer = threading.Timer(1.0, fp.instances["tcp"].heal)
        t0 = time.monotonic()
        healer.start()
        h = eng.submit([Request(READ, local, i << 24, ro_peer.seg("ro"), i << 24, 16 << 20) for i in range(4)],
                       deadline=10)  # fmt: skip
        parked = 0
        while h.poll() == "pending" and healer.is_alive():  # until the paths heal
            parked = max(parked, eng._recovery.parked())
            time.sleep(0.01)
        h.wait()
        healer.join()
        took = time.monotonic() - t0
        assert parked > 0 and 1.0 <= took < 10, (parked, took)  # completed inside its deadline
        assert np.array_equal(local.array, pattern(64 << 20, seed=1))
        assert h.outage is not None and not h.outage.ongoing


def test_first_transfer_survives_failed_connects(ro_peer):
    """A fresh engine whose first connects fail (a fabric still coming up) retries until it works."""
    fp = FaultPlugin("tcp")
    with Engine({"transports": {"faulty_tcp": RAILS2}}, plugins=[fp], transports=["faulty_tcp"]) as eng:
        local = eng.allocate(8 << 20)
        fp.instances["tcp"].inject(TENT_E_CONNECT)
        threading.Timer(0.3, fp.instances["tcp"].heal).start()
        eng.submit([Request(READ, local, 0, ro_peer.seg("ro"), 0, 8 << 20)], deadline=60).wait()
        assert np.array_equal(local.array, pattern(64 << 20, seed=1)[: 8 << 20])
        assert fp.instances["tcp"].injected > 0


def test_deadline_error_says_what_was_tried(ro_peer):
    fp = FaultPlugin("tcp")
    with Engine({"transports": {"faulty_tcp": RAILS2}}, plugins=[fp], transports=["faulty_tcp"]) as eng:
        local = eng.allocate(1 << 20)
        eng.read(local, ro_peer.seg("ro"), 1 << 20)
        fp.instances["tcp"].inject(TENT_E_CONNECT)
        t0 = time.monotonic()
        with pytest.raises(PeerSilentError) as err:
            eng.submit([Request(READ, local, 0, ro_peer.seg("ro"), 0, 1 << 20)], deadline=1.5).wait()
        assert 1.4 < time.monotonic() - t0 < 5.0  # at its deadline (the upper bound: no hang)
        text = str(err.value)
        assert "missed its 1.5s deadline" in text and "E_CONNECT" in text and "retry round" in text, text
        assert "control endpoint: answered" in text, text  # the peer is alive; only its paths fail
        fp.instances["tcp"].heal()
        eng.read(local, ro_peer.seg("ro"), 1 << 20, timeout=10)  # not remembered as dead: it answered


def test_congestion_reported_by_the_executor_reaches_the_rail_monitor():
    """Item 4's soft signal end to end: the peer stops reading (SIGSTOP) while a WRITE is on the
    wire, so the TCP executor's send buffer fills and stops draining; it reports congestion
    (rail_stats()["congestion"]), the health tick feeds it to the rail monitor as a congestion
    error, and the WRITE completes, every byte right, once the peer reads again (the progress
    timeout, 20 s here, is far away: congestion is not a failure)."""
    # small socket buffers on both ends, so the stopped peer's kernel cannot swallow the whole WRITE
    small = {"sockbuf": 64 << 10, "conns_per_rail": 1}
    tcp = {"rails": ["127.0.0.1"], "slice_timeout_ms": 20_000, "congestion_ms": 100, **small}
    peer = Peer(size=64 << 20, config={"transports": {"tcp": {**RAILS2, **small}}})
    # The stopped peer silences both rails; stall detection (its own tests: test_policies, the
    # resilience suites) must not pause them first, or the congestion they report goes unheard
    # (a paused rail's congestion is not counted), so it is set far away here.
    health = {"stall_s": 5.0, "stall_cut_s": 10.0}
    try:
        with Engine({"transports": {"tcp": tcp}, "health": health}, transports=["tcp"]) as eng:
            heard: list[object] = []
            on_error = eng.monitor.on_error

            def spy(rail, now, congestion=False):  # records, then does what the monitor does
                if congestion:
                    heard.append(rail)
                return on_error(rail, now, congestion=congestion)

            eng.monitor.on_error = spy  # type: ignore[method-assign]
            src = eng.allocate(64 << 20)
            src.array[:] = pattern(64 << 20, seed=5)
            eng.read(eng.allocate(1 << 20), peer.seg("rw"), 1 << 20)  # connected
            peer.stop()
            h = eng.submit([Request(WRITE, src, 0, peer.seg("rw"), 0, 64 << 20)], deadline=60)
            end = time.monotonic() + 15  # below the progress timeout: a timeout would be a slice error
            while not heard and time.monotonic() < end:  # until the monitor hears of it (event, bounded)
                time.sleep(0.02)
            peer.cont()
            h.wait()
            stats = [s for s in eng.rail_stats() if s["peer"] == peer.engine_id]
            assert heard and sum(s["congestion"] for s in stats) >= 1, (heard, [(s["congestion"], s["errors"], s["bytes"], s["state"]) for s in stats])
            assert sum(s["errors"] for s in stats) == 0, stats
        assert peer.digest("rw", 0, 64 << 20) == sha(pattern(64 << 20, seed=5))
    finally:
        peer.cont()
        peer.close()


def test_a_short_deadline_does_not_fail_a_long_one_on_a_silent_peer():
    """Two requests wait on a stopped peer: one with a 1.5 s deadline, one with 30 s. The short one
    ends at its deadline (PeerSilentError) and the peer is remembered dead, so a new request fails
    at once; the long one keeps waiting and completes, every byte right, once the peer continues."""
    peer = Peer(size=16 << 20, config={"transports": {"tcp": RAILS2}})
    try:
        with Engine({"transports": {"tcp": RAILS2}}, transports=["tcp"]) as eng:
            short, long_ = eng.allocate(8 << 20), eng.allocate(8 << 20)
            eng.read(short, peer.seg("ro"), 1 << 20)
            peer.stop()
            h_long = eng.submit([Request(READ, long_, 0, peer.seg("ro"), 8 << 20, 8 << 20)], deadline=30)
            with pytest.raises(PeerSilentError):
                eng.submit([Request(READ, short, 0, peer.seg("ro"), 0, 8 << 20)], deadline=1.5).wait()
            with pytest.raises(PeerUnreachableError, match="requests fail at once"):
                eng.submit([Request(READ, short, 0, peer.seg("ro"), 0, 1 << 20)], deadline=30).wait()
            assert h_long.poll() == "pending"  # still waiting for its own deadline
            peer.cont()
            h_long.wait()  # raises if it failed
            assert np.array_equal(long_.array, pattern(16 << 20, seed=1)[8 << 20 :])
    finally:
        peer.cont()
        peer.close()


def test_a_waiting_batch_says_how_long_its_peer_has_been_silent():
    """`BatchHandle.silent_for()`: 0 while the paths work; once a stopped peer's paths have all
    failed, how long the outage has lasted (an application with another source cancels there)."""
    peer = Peer(size=16 << 20, config={"transports": {"tcp": RAILS2}})
    try:
        with Engine({"transports": {"tcp": RAILS2}}, transports=["tcp"]) as eng:
            local = eng.allocate(16 << 20)
            ok = eng.submit([Request(READ, local, 0, peer.seg("ro"), 0, 1 << 20)], deadline=10.0)
            assert ok.wait(10.0) and ok.silent_for() == 0.0
            peer.stop()
            h = eng.submit([Request(READ, local, 0, peer.seg("ro"), 0, 16 << 20)], deadline=30.0)
            t0, seen = time.monotonic(), 0.0
            while seen < 0.5:  # the stall is cut, the paths fail, the outage begins and grows
                assert time.monotonic() - t0 < 20.0, "the outage of a stopped peer was never reported"
                assert not h.wait(0.05)
                seen = h.silent_for()
            assert time.monotonic() - t0 >= seen  # not longer than the batch has waited
            h.cancel()
            with pytest.raises(CancelledError):
                h.wait(10.0)
    finally:
        peer.proc.send_signal(signal.SIGCONT)
        peer.close()
