"""A rail whose estimate a bad moment left far below its sibling's is given traffic again after
`scheduler.bandwidth_stale_s`, on a real engine over two loopback TCP rails with probes off (the
policy itself: tests/test_policies.py, test_a_starved_idle_rail_gets_traffic_again_after_the_stale_time)."""

from __future__ import annotations

import time

import pytest
from peers import Peer

from tent_core import READ, Engine, Request

RAILS2 = {"rails": ["127.0.0.1", "127.0.0.2"]}
MiB = 1 << 20


def _rail1_bytes(stale_s: float, length: int, for_s: float) -> tuple[int, float]:
    """Requests of `length` bytes every 10 ms for up to `for_s` seconds after rail 1's estimate is
    set to 10 kB/s; what rail 1 moved by the first one it served (0: none), and its estimate then."""
    peer = Peer(size=64 << 20, config={"transports": {"tcp": RAILS2}}, transports=["tcp"])
    try:
        cfg = {"transports": {"tcp": RAILS2}, "scheduler": {"probe_every": 0, "bandwidth_stale_s": stale_s}}
        with Engine(cfg, transports=["tcp"]) as eng:
            local = eng.allocate(64 << 20)
            eng.read(local, peer.seg("rw"), 8 * MiB)  # connect both rails
            rails = {r.info.index: r for p in eng.peers.peers() for rt in p.routes.values() for r in rt.rails}
            time.sleep(0.2)  # the connecting read's samples are folded (windows of 50 ms)
            # what a sample from a CPU-starved moment left (far below its sibling's ~0.3-2 GB/s): the
            # spray gives such a rail nothing (its water-filled share is under one slice, whatever the
            # sibling's estimate), so without the stale rule nothing measures it again
            rails[1].telemetry.bandwidth_Bps = 1e4
            base = {r["index"]: r["bytes"] for r in eng.rail_stats()}
            end = time.monotonic() + for_s
            moved = 0
            while time.monotonic() < end and not moved:
                assert eng.submit([Request(READ, local, 0, peer.seg("rw"), 0, length)]).wait(timeout=30)
                moved = {r["index"]: r["bytes"] for r in eng.rail_stats()}[1] - base[1]
                time.sleep(0.01)
            time.sleep(0.1)  # a health tick or two fold its sample
            return moved, rails[1].telemetry.bandwidth_Bps
    finally:
        peer.close()


@pytest.mark.parametrize("length", [256 << 10, 32 * MiB], ids=["mice", "elephants"])
def test_a_starved_rail_is_given_traffic_after_the_stale_time(length):
    moved, estimate = _rail1_bytes(0.5, length, 10.0)
    assert moved > 0, "rail 1 never got traffic again"
    assert estimate > 1e4  # its sample moved the estimate


def test_without_the_stale_rule_the_starved_rail_stays_out():
    moved, estimate = _rail1_bytes(0.0, 32 * MiB, 2.0)
    assert moved == 0 and estimate == 1e4  # nothing measured it
