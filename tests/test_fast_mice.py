"""Mice on a route of several rails take the native fast path (issue 17), on a real engine and a
real peer process over two loopback TCP rails: their rail is chosen per request in C from the
rails' published state (the policy itself: tests/test_mouse_policy.py), they spread over both
rails under load, and they leave a failing rail (faults injected into the real tcp executor, as
tests/test_resilience.py) and come back when it is re-admitted."""

from __future__ import annotations

import time

import numpy as np
import pytest
from peers import Peer

from tent_core import READ, Engine, Request
from tent_core.rail_monitor import RailState
from tent_core.recovery import PROBE_BYTES, PROGRESS
from tent_core.testing import TENT_E_IO, FaultPlugin, pattern

RAILS2 = {"rails": ["127.0.0.1", "127.0.0.2"]}
KiB, MiB = 1 << 10, 1 << 20
SIZE = 64 * MiB
MOUSE = 64 * KiB


@pytest.fixture(scope="module")
def peer():
    p = Peer(size=SIZE, config={"transports": {"tcp": RAILS2}}, transports=["tcp"])
    yield p
    p.close()


def _rail_bytes(eng: Engine) -> dict[int, int]:
    return {r["index"]: r["bytes"] for r in eng.rail_stats()}


def _mice(local, peer: Peer, n: int, start: int = 0) -> list[Request]:
    """n 64 KiB READs of distinct parts of the peer's "ro" segment into the same parts of `local`."""
    return [Request(READ, local, o, peer.seg("ro"), o, MOUSE) for o in ((start + i) * MOUSE % SIZE for i in range(n))]


def _run_load(eng: Engine, local, peer: Peer, batches: int, per_batch: int = 32, depth: int = 4) -> None:
    """`batches` batches of mice, `depth` of them in flight at a time (load: queues on both rails)."""
    inflight = []
    for b in range(batches):
        inflight.append(eng.submit(_mice(local, peer, per_batch, b * per_batch), deadline=30))
        if len(inflight) >= depth:
            assert inflight.pop(0).wait(timeout=30)
    for h in inflight:
        assert h.wait(timeout=30)


def test_mice_of_two_rails_go_native_and_spread_over_both(peer):
    with Engine({"transports": {"tcp": RAILS2}}, transports=["tcp"]) as eng:
        local = eng.allocate(SIZE)
        src = pattern(SIZE, seed=1)
        eng.read(local, peer.seg("ro"), 8 * MiB)  # connects both rails
        eng.submit(_mice(local, peer, 1), deadline=30).wait()  # planned, and its class cached
        fast = eng._fast
        time.sleep(0.05)  # a health tick publishes both rails again
        local.array[:] = 0
        hits, mice, before = fast.hits, fast.mice, _rail_bytes(eng)
        _run_load(eng, local, peer, batches=64)
        n = 64 * 32
        assert fast.hits == hits + 64, "a batch of mice went to the planner"
        assert fast.mice == mice + n  # each mouse's rail chosen natively
        got = {i: b - before.get(i, 0) for i, b in _rail_bytes(eng).items()}
        assert sum(got.values()) == n * MOUSE, got
        assert min(got.values()) >= n * MOUSE // 8, f"mice not spread over both rails: {got}"
        assert np.array_equal(local.array, src), "mice landed wrong bytes"
        # the fast path's assignments reach the telemetry (folded by the health tick) as the
        # planner's own would: nothing is left unfolded once the load is over
        time.sleep(0.1)
        rails = [r for p in eng.peers.peers() for rt in p.routes.values() for r in rt.rails]
        assert len(rails) == 2
        for r in rails:
            added, _ = fast.rail_added(r.stat_index)
            assert added == 0, (r.info.name, added)


def test_an_elephant_of_a_cached_class_still_goes_to_the_planner(peer):
    with Engine({"transports": {"tcp": RAILS2}}, transports=["tcp"]) as eng:
        local = eng.allocate(SIZE)
        eng.read(local, peer.seg("ro"), 8 * MiB)
        eng.submit(_mice(local, peer, 1), deadline=30).wait()
        fast = eng._fast
        hits, mice = fast.hits, fast.mice
        # a request of the same class at the threshold is an elephant: sprayed by the planner
        eng.submit([Request(READ, local, 0, peer.seg("ro"), 0, 4 * MiB)], deadline=30).wait()
        assert (fast.hits, fast.mice) == (hits, mice)
        eng.submit(_mice(local, peer, 1), deadline=30).wait()
        assert (fast.hits, fast.mice) == (hits + 1, mice + 1)
        assert np.array_equal(local.array[: 4 * MiB], pattern(SIZE, seed=1)[: 4 * MiB])


class _MiceDuringFold:
    """The engine's real FastPath, except that each fold of the health tick (`rail_added`) is
    followed at once by a batch of native mice, carried out before the tick goes on: the worst
    interleaving of a submitting thread with the tick, made deterministic."""

    def __init__(self, fast, go) -> None:
        self._fast, self._go = fast, go

    def rail_added(self, stat_index: int):
        got = self._fast.rail_added(stat_index)
        self._go()
        return got

    def __getattr__(self, name: str):
        return getattr(self._fast, name)


def test_a_mouse_placed_during_a_tick_counts_in_pending_bytes_exactly_once(peer):
    """A mouse the fast path places after the tick folded a rail but before the tick observed the
    rail's native stats must not stay counted in pending bytes once its bytes are seen (the tick
    reads the stats before it folds). The ticks after it come well within pending_ttl_s, so only
    the reconcile can clear it; the settling waits the TTL out once, for what the first tick of a
    new route cannot reconcile (the connecting read)."""
    ttl = 0.5
    cfg = {"transports": {"tcp": RAILS2}, "scheduler": {"pending_ttl_s": ttl}}
    with Engine(cfg, transports=["tcp"]) as eng:
        local = eng.allocate(SIZE)
        eng.read(local, peer.seg("ro"), 8 * MiB)
        eng.submit(_mice(local, peer, 1), deadline=30).wait()  # its class cached
        PROGRESS.detach(eng)  # from here the test drives the health ticks itself
        rails = [r for p in eng.peers.peers() for rt in p.routes.values() for r in rt.rails]
        fast = eng._fast
        eng._health_tick(time.monotonic())
        time.sleep(ttl * 1.2)
        for _ in range(2):  # settle: every earlier assignment seen (or expired), folded and published
            eng._health_tick(time.monotonic())
        assert all(fast.rail_watched(r.stat_index) for r in rails)
        assert [r.telemetry.pending_bytes for r in rails] == [0, 0]
        mice, start = fast.mice, [0]

        def go() -> None:
            start[0] += 8
            assert eng.submit(_mice(local, peer, 8, start[0]), deadline=30).wait(timeout=30)

        eng._fast = _MiceDuringFold(fast, go)
        try:
            eng._health_tick(time.monotonic())
        finally:
            eng._fast = fast
        assert fast.mice == mice + 16  # both folds were followed by native mice, all done
        for _ in range(2):  # their bytes are seen and folded
            eng._health_tick(time.monotonic())
        assert [fast.rail_added(r.stat_index)[0] for r in rails] == [0, 0]
        assert [r.telemetry.pending_bytes for r in rails] == [0, 0], "a mouse counted twice in pending bytes"


class _CountPublishes:
    """The engine's real FastPath, counting the health tick's publishes."""

    def __init__(self, fast) -> None:
        self._fast, self.published = fast, 0

    def rail_publish(self, *args):
        self.published += 1
        return self._fast.rail_publish(*args)

    def __getattr__(self, name: str):
        return getattr(self._fast, name)


def test_the_tick_publishes_only_rails_a_cached_entry_of_mice_reads(peer):
    """The health tick publishes a multi-rail route's rails only while a cached entry of mice reads
    them (or they hold native assignments not folded yet): a route of elephants, or one whose
    entries a generation change dropped, costs the tick no publish."""
    with Engine({"transports": {"tcp": RAILS2}}, transports=["tcp"]) as eng:
        local = eng.allocate(SIZE)
        eng.read(local, peer.seg("ro"), 8 * MiB)  # an elephant: sprayed, nothing cached
        PROGRESS.detach(eng)  # from here the test drives the health ticks itself
        rails = [r for p in eng.peers.peers() for rt in p.routes.values() for r in rt.rails]
        fast = eng._fast
        counter = _CountPublishes(fast)
        eng._fast = counter

        def tick() -> int:
            before = counter.published
            eng._health_tick(time.monotonic())
            return counter.published - before

        try:
            assert tick() == 0 and not any(fast.rail_watched(r.stat_index) for r in rails)
            eng.submit(_mice(local, peer, 1), deadline=30).wait()  # planned, its class cached
            assert all(fast.rail_watched(r.stat_index) for r in rails)
            assert tick() == 2
            mice = fast.mice
            assert eng.submit(_mice(local, peer, 8, 1), deadline=30).wait(timeout=30)
            assert fast.mice == mice + 8
            fast.invalidate()  # the entry is gone, but the 8 mice are not folded yet
            # which rails took them is the policy's choice from the rails' estimates (all 8 may go to
            # one when the other looked slow): those, and only those, are still watched
            took = [fast.rail_added(r.stat_index)[0] > 0 for r in rails]
            assert any(took) and [fast.rail_watched(r.stat_index) for r in rails] == took
            assert tick() == sum(took)  # folded and published once more
            assert [fast.rail_added(r.stat_index)[0] for r in rails] == [0, 0]
            assert not any(fast.rail_watched(r.stat_index) for r in rails)
            assert tick() == 0
            eng.submit(_mice(local, peer, 1), deadline=30).wait()  # cached again: watched again
            assert tick() == 2
        finally:
            eng._fast = fast


def _slot(eng: Engine, index: int) -> int:
    return next(r.slot for p in eng.peers.peers() for rt in p.routes.values() for r in rt.rails if r.info.index == index)


def test_native_mice_leave_a_failing_rail_and_return_when_it_is_readmitted(peer):
    fp = FaultPlugin("tcp")
    cfg = {"transports": {"faulty_tcp": RAILS2}, "health": {"cooldown_base_s": 0.1, "quiet_period_s": 0.2}}
    with Engine(cfg, plugins=[fp], transports=["faulty_tcp"]) as eng:
        ft = fp.instances["tcp"]
        local = eng.allocate(SIZE)
        src = pattern(SIZE, seed=1)
        eng.read(local, peer.seg("ro"), 8 * MiB)
        eng.submit(_mice(local, peer, 1), deadline=30).wait()
        time.sleep(0.05)
        fast = eng._fast
        before = _rail_bytes(eng)
        _run_load(eng, local, peer, batches=8)
        assert min(b - before[i] for i, b in _rail_bytes(eng).items()) > 0  # both rails carry mice
        ft.inject(TENT_E_IO, rails=[0])  # rail 0's slices now fail
        local.array[:] = 0
        _run_load(eng, local, peer, batches=16)  # every mouse lands, retried on rail 1 when it failed
        assert np.array_equal(local.array[: 16 * 32 * MOUSE], src[: 16 * 32 * MOUSE])
        assert ft.injected > 0
        assert eng.monitor.state(_slot(eng, 0), time.monotonic()) == RailState.PAUSED
        # a paused rail gets no mouse: the fast path keeps serving them, all on rail 1
        mice, frozen = fast.mice, _rail_bytes(eng)[0]
        injected = ft.injected
        _run_load(eng, local, peer, batches=16)
        assert fast.mice == mice + 16 * 32
        assert ft.injected - injected <= 4, "mice kept being sent to the paused rail"
        assert _rail_bytes(eng)[0] <= frozen + 4 * 4096  # heartbeats only
        ft.heal()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _rail_bytes(eng)[0] < frozen + 64 * MOUSE:
            _run_load(eng, local, peer, batches=4)
            time.sleep(0.02)
        assert _rail_bytes(eng)[0] >= frozen + 64 * MOUSE, "rail 0 never got mice again"
        assert fast.mice > mice + 16 * 32


@pytest.mark.netns
def test_native_mice_fail_over_when_a_real_rail_goes_down():
    """Two shaped veth rails between two network namespaces (tent_bench.testbed.Fabric); rail 1 is
    taken down (no socket error: its traffic just stops) while native mice flow. Every mouse lands
    intact (what hung on rail 1 is cut and retried on rail 0), rail 1 is paused, and the mice after
    that are still placed natively, on rail 0 only."""
    from tent_bench.testbed import Fabric

    ok, why = Fabric.available()
    if not ok:
        pytest.skip(f"fabric unavailable: {why}")
    import json
    import subprocess
    import sys
    from pathlib import Path

    from tent_core.testing import fresh_seed

    size, seed = 4 * MiB, fresh_seed()
    with Fabric(nodes=2, rails=2, rate="1gbit") as fab:
        tcfg = {"transports": {"tcp": {"rails": fab.addrs(1), "nominal_gbps": [1.0, 1.0]}}}
        target = fab.popen(1, [sys.executable, "-m", "tent_bench.target", "--size", str(size), "--host", fab.addrs(1)[0],
                               "--port", "47311", "--config", json.dumps(tcfg), "--pattern", "--seed", str(seed)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        ini = None
        try:
            segment = json.loads(target.stdout.readline())["segment"]  # type: ignore[union-attr]
            icfg = {"transports": {"tcp": {"rails": fab.addrs(0, peer=1), "nominal_gbps": [1.0, 1.0]}}}
            ini = fab.popen(0, [sys.executable, str(Path(__file__).parent / "mice_fabric_initiator.py"), segment, str(seed),
                                str(size), fab.addrs(0, peer=1)[0], json.dumps(icfg)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
            ready = json.loads(ini.stdout.readline() or "{}")  # type: ignore[union-attr]
            assert ready.get("phase") == "ready", ini.stderr.read()[-3000:] if ini.poll() is not None else ready  # type: ignore[union-attr]
            assert ready["mice"] == 32 * 16 and min(ready["by_rail"].values()) > 0, ready  # native, both rails
            fab.down(1)
            out, err = ini.communicate("go\n", timeout=120)
            assert ini.returncode == 0, err[-3000:]
            done = json.loads(out.strip().splitlines()[-1])
        finally:
            for p in (ini, target):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.wait(10)
    assert done["intact"], done  # every mouse of the failover landed the right bytes
    assert done["paused_after_s"] is not None and done["paused_now"], done
    assert done["mice_after"] == 32 * 16, done  # still placed natively ...
    # ... and none on the dead rail: nothing completed, failed or hangs there but heartbeats (one
    # is due every cooldown, 0.05-0.15 s, and waits probe_timeout_s, 0.25 s, before it is cut, so
    # two or three can be in flight at once)
    assert done["rail1_after"] == 0 and done["rail1_errors_after"] <= 2, json.dumps(done)
    assert done["rail1_inflight"] <= 4 and done["rail1_inflight_bytes"] <= done["rail1_inflight"] * PROBE_BYTES, json.dumps(done)
