"""Lifetimes: rail slots come back, close() fences the progress thread, closed executors refuse
submits. Regression tests for leaks and races of the engine before the split."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from peers import Peer

from tent_core import Engine, _native
from tent_core.abi import SLICE_DTYPE, StatField, Status
from tent_core.rails import RAILS, RailTable
from tent_core.types import OpCode, RailInfo


def test_rail_slots_are_released_and_reused():
    """Rail slots used to be allocated forever: peer churn exhausted the table."""
    table = RailTable(4, install=False)  # private counters; the process's RAILS is untouched
    rails = [table.acquire("tcp", f"peer-{i}", RailInfo(0, "r")) for i in range(4)]
    with pytest.raises(RuntimeError, match="rail slots"):
        table.acquire("tcp", "peer-4", RailInfo(0, "r"))
    shared = table.acquire("tcp", "peer-0", RailInfo(0, "r"))  # a second holder of the same rail
    assert shared is rails[0]
    assert not table.release(rails[0]) and table.in_use() == 4  # one holder left
    assert table.release(rails[0]) and table.in_use() == 3
    # a released slot with a slice still in flight is not handed out until that slice lands
    table.stats[rails[0].slot, StatField.INFLIGHT_SLICES] = 1
    with pytest.raises(RuntimeError, match="in flight"):
        table.acquire("tcp", "peer-5", RailInfo(0, "r"))
    table.stats[rails[0].slot, StatField.INFLIGHT_SLICES] = 0
    table.stats[rails[0].slot, StatField.BYTES_DONE] = 123
    fresh = table.acquire("tcp", "peer-5", RailInfo(0, "r"))
    assert fresh.slot == rails[0].slot and table.stats[fresh.slot, : StatField.GENERATION].sum() == 0  # reused, zeroed
    assert fresh.stat_index != rails[0].stat_index  # a slice of the old rail names another generation
    assert table.by_index(rails[0].stat_index) is None and table.by_index(fresh.stat_index) is fresh
    assert not table.release(rails[0])  # a stale release is ignored
    for r in [fresh, *rails[1:]]:
        assert table.release(r)
    assert table.in_use() == 0 and table.high_water == 4


RAW_ROWS_THEN_A_RAIL = textwrap.dedent(
    """
    import json
    import sys

    import numpy as np

    sys.path.insert(0, sys.argv[1])
    from peers import Peer
    from tent_core import Engine, _native
    from tent_core.abi import SLICE_DTYPE
    from tent_core.rails import RAILS
    from tent_core.types import OpCode

    a, b = Peer(size=4 << 20, transports=["tcp"]), Peer(size=4 << 20, transports=["tcp"])
    try:
        with Engine(transports=["tcp"]) as eng:
            local = eng.allocate(1 << 20)
            eng.read(local, a.seg("ro"), 4096)  # the route to a
            route = eng.peers.lookup(a.engine_id).routes["tcp"]
            ro = next(x for x in eng.peer_buffers(a.engine_id) if x["segment"] == "ro")
            # raw slices, as executor tests and tools submit them, naming rows no rail holds yet;
            # the last two read past the buffer (the target refuses them: errors)
            free = RAILS.high_water
            arr = np.zeros(10, SLICE_DTYPE)
            for i in range(10):
                remote = ro["addr"] + (i << 16) if i < 8 else ro["addr"] + ro["length"] + (1 << 20)
                arr[i] = (local.addr + (i << 16), remote, 1 << 16, route.link.handle, 0, 0, int(OpCode.READ), 0,
                          free + i % 4, 0)
            batch = _native.Batch(10)
            ex = route.transport.executor
            assert _native.submit(ex.ops, ex.handle, batch, arr, False) == 0
            assert batch.wait(20)
            eng.read(local, b.seg("ro"), 1 << 20)  # a new route: rails on the next free slots
            rows = [r for r in eng.rail_stats() if r["peer"] == b.engine_id]
            print(json.dumps({k: sum(r[k] for r in rows) for k in ("bytes", "errors", "slices")}))
    finally:
        a.close()
        b.close()
    """
)


def test_a_new_rail_counts_only_its_own_slices():
    """A rail taking a slot no rail held before got whatever raw slices (executor tests in the same
    process naming rows 0..63) had counted there: refhub's same-host test saw 626 KB and errors on
    a fresh shm rail after the plugins' tests. Its row starts at zero, and a slice that names no
    rail's generation counts nowhere. In a process of its own: the table's next slot is a fresh one."""
    import json
    from pathlib import Path

    proc = subprocess.run([sys.executable, "-c", RAW_ROWS_THEN_A_RAIL, str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["bytes"] == 1 << 20 and out["errors"] == 0 and out["slices"] >= 1, out


@pytest.fixture(scope="module")
def peer():
    p = Peer(size=4 << 20, config={"transports": {"tcp": {"rails": ["127.0.0.1", "127.0.0.2"]}}}, transports=["tcp"])
    yield p
    p.close()


def test_engine_churn_does_not_grow_the_rail_table(peer):
    cfg = {"transports": {"tcp": {"rails": ["127.0.0.1", "127.0.0.2"]}}}
    before = RAILS.in_use()
    high = []
    for _ in range(6):
        with Engine(cfg, transports=["tcp"]) as eng:
            local = eng.allocate(1 << 20)
            eng.read(local, peer.seg("rw"), 1 << 20, timeout=20)
            assert RAILS.in_use() == before + 2
        assert RAILS.in_use() == before
        high.append(RAILS.high_water)
    assert high[-1] == high[0], high  # later engines reuse the slots of earlier ones


def test_a_released_rails_late_slices_count_nowhere(peer):
    """A slice made for a rail before it was released (a plan dispatched late, a retry, a heartbeat)
    names that rail's generation of the slot: it counts on no row, whoever holds the slot now."""
    cfg = {"transports": {"tcp": {"rails": ["127.0.0.1", "127.0.0.2"]}}}
    with Engine(cfg, transports=["tcp"]) as eng:
        local = eng.allocate(1 << 20)
        eng.read(local, peer.seg("ro"), 1 << 20)
        old = eng.peers.lookup(peer.engine_id).routes["tcp"].rails
        eng.peers.forget(eng.peers.lookup(peer.engine_id))  # the route goes, its rails are released
        assert all(RAILS.by_index(r.stat_index) is None for r in old)
        eng.read(local, peer.seg("ro"), 4096)  # a new route: new rails, maybe on the same slots
        route = eng.peers.lookup(peer.engine_id).routes["tcp"]
        ro = next(x for x in eng.peer_buffers(peer.engine_id) if x["segment"] == "ro")
        rows_before = {r.slot: RAILS.row(r.slot)[StatField.BYTES_DONE] for r in old}
        batch = _native.Batch(len(old))
        arr = np.zeros(len(old), SLICE_DTYPE)
        for i, r in enumerate(old):  # through the live link, each named as its old rail's slices were
            arr[i] = (local.addr, ro["addr"], 1 << 16, route.link.handle, 0, 0, int(OpCode.READ), i, r.stat_index, 0)
        assert _native.submit(route.transport.executor.ops, route.transport.executor.handle, batch, arr, False) == 0
        assert batch.wait(20) and batch.error == 0
        stats = eng.rail_stats()
        assert sum(r["bytes"] for r in stats) == 4096, stats  # only what the new route moved
        for r in old:  # nor on an old slot no rail took again
            if RAILS.by_slot(r.slot) is None:
                assert RAILS.row(r.slot)[StatField.BYTES_DONE] == rows_before[r.slot]


def test_close_fences_the_progress_thread():
    """close() used to return while the progress thread was still inside a call into the engine
    (a health tick, a retry), which then ran against closed transports."""
    eng = Engine(transports=["tcp"])
    calls: list[tuple[str, float]] = []
    entered = threading.Event()

    def slow_tick(now: float) -> None:
        calls.append(("enter", time.monotonic()))
        entered.set()
        time.sleep(0.3)
        calls.append(("exit", time.monotonic()))

    eng._health_tick = slow_tick  # type: ignore[method-assign]
    assert entered.wait(10), "the progress thread never ticked the engine"
    eng.close()
    closed_at = time.monotonic()
    time.sleep(0.3)  # any call after close would show up here
    assert calls and all(t <= closed_at for _, t in calls), (calls, closed_at)
    assert calls[-1][0] == "exit"


SUBMIT_AFTER_CLOSE = textwrap.dedent(
    """
    import json
    import numpy as np
    import tent_core.rails  # noqa: F401  (telemetry slots)
    from tent_core import _native
    from tent_shm.plugin import get_lib

    lib = get_lib()
    ex = lib.library.create({"threads": 1})
    ops, handle = ex.ops, ex.handle
    ex.close()
    buf = np.zeros(64, np.uint8)
    out = {}
    for name, h in (("zero", 0), ("stale", handle)):
        b = _native.Batch(1)
        out[name] = _native.submit_one(ops, h, b, 0, buf.ctypes.data, buf.ctypes.data, 64, 1, 0, 0, 0)
    print(json.dumps(out))
    """
)


def test_submit_to_a_closed_executor_is_refused_not_a_crash():
    """The native submit used to call through whatever executor handle it was given: a closed
    executor's (0 or stale) handle crashed the process."""
    proc = subprocess.run([sys.executable, "-c", SUBMIT_AFTER_CLOSE], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    import json

    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"zero": Status.E_INTERNAL, "stale": Status.E_INTERNAL}


def test_executor_close_waits_for_a_submit_inside_it():
    """Retiring an executor waits until no native submit is inside it (then destroy is safe)."""
    import os

    from tent_shm.plugin import get_lib

    from tent_core import _native

    lib = get_lib()
    ex = lib.library.create({"threads": 1})
    me = lib.peer_add(ex.handle, os.getpid(), 0)  # this very process, through process_vm_readv
    buf = np.zeros(1 << 16, np.uint8)
    stop = threading.Event()
    results: list[object] = []

    def submitter() -> None:
        while not stop.is_set():
            b = _native.Batch(1)
            rc = _native.submit_one(ex.ops, ex.handle, b, 0, buf.ctypes.data, buf.ctypes.data, 1 << 16, me, 0, 0, 0)
            results.append(rc)
            if rc == 0 and not b.wait(10):
                results.append("hung")  # an accepted slice must always be reported

    threads = [threading.Thread(target=submitter) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    ex.close()  # concurrent submits either got in before (and are reported) or are refused
    stop.set()
    for t in threads:
        t.join(10)
    assert results and set(results) <= {0, Status.E_INTERNAL}
