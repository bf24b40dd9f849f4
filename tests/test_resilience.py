"""Retries, rail failover, re-admission and transport substitution, driven by injected faults
(the fault executor wraps the real transports; the bytes still move over real sockets/syscalls)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from peers import Peer

from tent_core import READ, Engine, PeerUnreachableError, Request
from tent_core.rail_monitor import RailState
from tent_core.testing import TENT_E_IO, TENT_E_TIMEOUT, FaultPlugin, pattern

RAILS2 = {"rails": ["127.0.0.1", "127.0.0.2"]}


@pytest.fixture(scope="module")
def peer():
    p = Peer(size=64 << 20, config={"transports": {"tcp": RAILS2}})
    yield p
    p.close()


def _bytes_by(eng: Engine, key: str) -> dict:
    out: dict = {}
    for r in eng.rail_stats():
        out[r[key]] = out.get(r[key], 0) + r["bytes"]
    return out


def test_same_host_transport_fails_mid_transfer_and_tcp_finishes(peer):
    fp = FaultPlugin("shm")
    with Engine(plugins=[fp], transports=["tcp", "faulty_shm"]) as eng:
        local = eng.allocate(64 << 20)
        fp.instances["shm"].inject(TENT_E_IO, skip_first=4)
        reqs = [Request(READ, local, i << 22, peer.seg("ro"), i << 22, 4 << 20) for i in range(16)]
        t0 = time.monotonic()
        eng.submit(reqs, deadline=20).wait()
        assert np.array_equal(local.array, pattern(64 << 20, seed=1))
        used = _bytes_by(eng, "transport")
        assert used["faulty_shm"] >= 4 * (4 << 20) and used["tcp"] >= 1 << 20, used
        assert fp.instances["shm"].injected > 0
        assert time.monotonic() - t0 < 10
        # the failed transport stays substituted for this peer: later requests go straight to tcp
        before = used["tcp"]
        eng.read(local, peer.seg("ro"), 1 << 20)
        assert _bytes_by(eng, "transport")["tcp"] == before + (1 << 20)


def test_failed_rail_is_avoided_retried_and_readmitted(peer):
    fp = FaultPlugin("tcp")
    cfg = {"transports": {"faulty_tcp": RAILS2}, "health": {"cooldown_base_s": 0.1, "quiet_period_s": 0.2}}
    with Engine(cfg, plugins=[fp], transports=["faulty_tcp"]) as eng:
        ft = fp.instances["tcp"]
        local = eng.allocate(64 << 20)
        src = pattern(64 << 20, seed=1)
        eng.read(local, peer.seg("ro"), 64 << 20)  # both rails connected and used
        by_rail = _bytes_by(eng, "index")
        assert by_rail[0] > 0 and by_rail[1] > 0, by_rail
        ft.inject(TENT_E_TIMEOUT, rails=[0])
        for _ in range(5):
            local.array[:] = 0
            eng.submit([Request(READ, local, 0, peer.seg("ro"), 0, 64 << 20)], deadline=20).wait()
            assert np.array_equal(local.array, src)
        rail0 = next(r for r in eng.rail_stats() if r["index"] == 0)
        assert rail0["errors"] > 0
        assert eng.monitor.state(next(iter(_slots(eng, 0))), time.monotonic()) == RailState.PAUSED
        frozen = _bytes_by(eng, "index")[0]
        eng.read(local, peer.seg("ro"), 64 << 20)
        assert _bytes_by(eng, "index")[0] <= frozen + 4096 * 4  # only heartbeats touch a paused rail
        ft.heal()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            eng.read(local, peer.seg("ro"), 16 << 20)
            if _bytes_by(eng, "index")[0] > frozen + (1 << 20):
                break
            time.sleep(0.02)
        assert _bytes_by(eng, "index")[0] > frozen + (1 << 20), "rail 0 was never re-admitted"


def _slots(eng: Engine, index: int):
    for peer in eng.peers.peers():
        for route in peer.routes.values():
            for r in route.rails:
                if r.info.index == index:
                    yield r.slot


def test_no_path_left_is_an_error_within_the_deadline(peer):
    fp = FaultPlugin("tcp")
    with Engine({"transports": {"faulty_tcp": RAILS2}}, plugins=[fp], transports=["faulty_tcp"]) as eng:
        local = eng.allocate(8 << 20)
        eng.read(local, peer.seg("ro"), 8 << 20)
        fp.instances["tcp"].inject(TENT_E_IO)
        t0 = time.monotonic()
        with pytest.raises(PeerUnreachableError):
            eng.submit([Request(READ, local, 0, peer.seg("ro"), 0, 8 << 20)], deadline=5).wait()
        assert time.monotonic() - t0 < 5.5
