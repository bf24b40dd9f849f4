"""The progress thread sleeps while nothing needs watching (issues 14/17: an idle engine's 100
health ticks per second cost ~2% of a core) and is back at its cadence as soon as something does:
a submit wakes it (the first one after a sleep only), a paused rail keeps it ticking until the rail
is re-admitted, a batch nobody waits on still expires at its deadline. Real engines, a real peer
process over loopback tcp; the thread's own counters (ticks, wake-ups, the native watch state),
never its speed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest
from peers import Peer
from peers import until as _until

from tent_core import READ, Engine, Request, _native
from tent_core.recovery import PROGRESS, shared_load_key

KiB = 1 << 10
SIZE = 1 << 20
IDLE = 2  # native.c's PROGRESS_IDLE


@pytest.fixture(scope="module")
def peer():
    p = Peer(size=SIZE, transports=["tcp"])
    yield p
    p.close()




def _asleep() -> bool:
    return _native.progress_state()[0] == IDLE and PROGRESS._sleeping


def _engine(idle_s: float, **extra: object) -> Engine:
    # the host-wide load table off: other processes' loopback traffic (other tests, benchmarks) is
    # load on our 127.0.0.1 rail there, and rightly keeps the thread at its cadence
    cfg = {"progress_idle_s": idle_s, "progress_idle_after_s": 0.1, "qos": {"shared_load": False}, **extra}
    return Engine(cfg, transports=["tcp"])


def test_an_idle_engine_wakes_its_thread_a_few_times_per_second_not_a_hundred(peer):
    with _engine(0.5) as eng:
        local = eng.allocate(SIZE)
        eng.read(local, peer.seg("ro"), SIZE)  # a connected route: rails whose health is watched
        _until(_asleep, 10, "the progress thread went to sleep")
        ticks, wakeups, t0 = PROGRESS.ticks, PROGRESS.wakeups, time.monotonic()
        time.sleep(2.0)
        elapsed = time.monotonic() - t0
        # one tick per 0.5 s sleep, +2 for the edges; at the 10 ms cadence it would be ~200
        bound = int(elapsed / 0.5) + 2
        assert PROGRESS.ticks - ticks <= bound, (PROGRESS.ticks - ticks, bound)
        assert PROGRESS.wakeups - wakeups <= bound, (PROGRESS.wakeups - wakeups, bound)
        assert PROGRESS.ticks - ticks >= 1, "a sleeping thread still ticks once per progress_idle_s"


def test_a_submit_after_a_sleep_completes_and_only_the_first_one_wakes_the_thread(peer):
    with _engine(30.0) as eng:  # asleep, it would not tick again for 30 s on its own
        local = eng.allocate(SIZE)
        eng.read(local, peer.seg("ro"), SIZE)
        _until(_asleep, 10, "the progress thread went to sleep")
        wakes = _native.progress_state()[1]
        local.array[:] = 0
        h = eng.submit([Request(READ, local, 0, peer.seg("ro"), 0, 64 * KiB)], deadline=10)
        assert _native.progress_state()[0] != IDLE, "the submit left the thread asleep"
        assert h.wait(timeout=10)
        ref = eng.allocate(SIZE)
        eng.read(ref, peer.seg("ro"), SIZE)
        assert np.array_equal(local.array[: 64 * KiB], ref.array[: 64 * KiB])
        for i in range(50):  # back-to-back submits find the thread awake: none pays a wake-up
            eng.submit([Request(READ, local, i * KiB, peer.seg("ro"), i * KiB, KiB)], deadline=10).wait(timeout=10)
        assert _native.progress_state()[1] == wakes + 1, "more than one submit paid a wake-up"
        _until(lambda: PROGRESS.ticks > 0 and not PROGRESS._sleeping, 5, "the thread ticks at its cadence")


def test_a_paused_rail_keeps_the_thread_ticking_until_a_heartbeat_readmits_it(peer):
    with _engine(30.0, health={"cooldown_base_s": 0.2}) as eng:
        local = eng.allocate(SIZE)
        eng.read(local, peer.seg("ro"), SIZE)
        _until(_asleep, 10, "the progress thread went to sleep")
        rail = next(r for p in eng.peers.peers() for rt in p.routes.values() for r in rt.rails)
        # a pause happens on the progress thread (a stall, a failure) or with a submit: both leave it awake
        eng.monitor.pause(rail.slot, time.monotonic())
        PROGRESS.wake()
        ticks = PROGRESS.ticks
        # asleep (30 s) it would never send the heartbeat in time; awake it does after the 0.2 s cooldown
        _until(lambda: eng.monitor.state(rail.slot, time.monotonic()).name != "PAUSED", 10,
               "a heartbeat re-admitted the paused rail")
        assert PROGRESS.ticks > ticks
        # re-admission is gradual (DEGRADED, then HEALTHY after the quiet period): the thread keeps
        # ticking through it, then sleeps again
        _until(lambda: eng.monitor.settled(time.monotonic()) and _asleep(), 30, "healthy again, then asleep")


def test_a_batch_nobody_waits_on_expires_at_its_deadline_after_a_sleep(peer):
    with _engine(30.0) as eng:
        local = eng.allocate(SIZE)
        eng.read(local, peer.seg("ro"), SIZE)
        _until(_asleep, 10, "the progress thread went to sleep")
        peer.stop()  # silent: the READ hangs until its deadline
        try:
            h = eng.submit([Request(READ, local, 0, peer.seg("ro"), 0, 64 * KiB)], deadline=1.0)
            # nobody polls or waits: only the progress thread's sweep can expire it
            _until(lambda: h._deadline_hit, 15, "the sweep expired the batch at its deadline")
        finally:
            peer.cont()
        _until(lambda: h.poll() == "failed", 10, "the expired batch reads failed")


# another process of this user publishing queued bytes on a rail, as its engine's health ticks do
_OTHER_PROCESS = textwrap.dedent("""
    import sys
    from tent_core.qos import SharedRailLoad
    table = SharedRailLoad(sys.argv[1])
    for line in sys.stdin:
        table.set(sys.argv[2], int(line))
        print("ok", flush=True)
""")


def test_another_process_load_on_a_shared_rail_keeps_the_thread_at_its_cadence(peer):
    name = f"idle-{uuid.uuid4().hex[:12]}"  # a table of our own: other tests' traffic stays out of it
    with _engine(0.5, qos={"shared_load": True, "shared_load_name": name}) as eng:
        local = eng.allocate(SIZE)
        eng.read(local, peer.seg("ro"), SIZE)
        rail = next(r for p in eng.peers.peers() for rt in p.routes.values() for r in rt.rails)
        _until(_asleep, 10, "the progress thread went to sleep")
        other = subprocess.Popen([sys.executable, "-c", _OTHER_PROCESS, name, shared_load_key(rail.transport, rail.info.name)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            def publish(nbytes: int) -> None:
                assert other.stdin is not None and other.stdout is not None
                other.stdin.write(f"{nbytes}\n")
                other.stdin.flush()
                assert other.stdout.readline().strip() == "ok"

            publish(64 << 20)
            # the next idle tick (<= 0.5 s) reads the other process's bytes and stays at its cadence
            _until(lambda: rail.telemetry.external_bytes == 64 << 20 and not PROGRESS._sleeping, 10,
                   "the other process's load woke the thread")
            ticks, t0 = PROGRESS.ticks, time.monotonic()
            time.sleep(1.0)
            elapsed = time.monotonic() - t0
            # asleep it would tick about twice in that second (0.5 s); awake, every 10 ms
            assert PROGRESS.ticks - ticks > 4 * (int(elapsed / 0.5) + 2), (PROGRESS.ticks - ticks, elapsed)
            assert not _asleep(), "slept with another process's bytes queued on its rail"
            publish(0)
            _until(_asleep, 10, "asleep again once the other process's rail load is gone")
        finally:
            if other.stdin is not None:
                other.stdin.close()
            other.wait(timeout=10)


def test_idle_knobs_are_validated():
    from tent_core import errors

    with pytest.raises(errors.InvalidRequestError, match="progress_idle_s"):
        Engine({"progress_idle_s": -1.0}, transports=["tcp"])
