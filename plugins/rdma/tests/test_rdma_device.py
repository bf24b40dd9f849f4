"""The RDMA transport on a real verbs device (Soft-RoCE inside scripts/rdma-vm.sh; any RDMA NIC).

Two processes on one device (loopback RC QPs): an initiator engine here, a target engine in
rdma_target.py. Skipped where no RDMA port is ACTIVE (the host suite runs these through
test_vm_suite.py, inside a guest).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from rdma_helpers import HERE, VM_ENGINE_CONFIG, Target, pattern64, rdma_engine, rdma_ports_active, rdma_skip_reason

from tent_core import _native, errors
from tent_core.engine import Engine, Request
from tent_core.types import OpCode, Permission

_SKIP = rdma_skip_reason()
pytestmark = pytest.mark.skipif(bool(_SKIP), reason=_SKIP)

MiB = 1 << 20
SEGMENTS = [
    {"name": "rw", "size": 8 * MiB, "seed": 1},
    {"name": "ro", "size": 1 * MiB, "seed": 2, "perm": int(Permission.READ)},
    {"name": "big", "size": 24 * MiB, "seed": 3},
]
E_BOUNDS, E_PERMISSION = -10, -11


@pytest.fixture(scope="module")
def targets() -> Iterator[tuple[Target, Target]]:
    """The target most tests use, and one the killed-peer test kills; started together."""
    main = Target(SEGMENTS, wait=False)
    victim = Target([{"name": "big", "size": 32 * MiB, "seed": 5}], wait=False)
    try:
        yield main.wait_ready(), victim.wait_ready()
    finally:
        victim.kill()
        main.close()


@pytest.fixture(scope="module")
def target(targets: tuple[Target, Target]) -> Target:
    return targets[0]


@pytest.fixture(scope="module")
def eng() -> Iterator[Engine]:
    e = rdma_engine(VM_ENGINE_CONFIG)
    assert "rdma" in e.transports, e.availability
    yield e
    e.close()


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(a.tobytes()).hexdigest()


def test_probe_names_the_device() -> None:
    from tent_rdma.transport import RdmaTransport

    avail = RdmaTransport().probe()
    assert avail.available, avail.reason
    assert any(d in avail.reason for d in rdma_ports_active())


def test_read_and_write_are_byte_exact(eng: Engine, target: Target) -> None:
    n = SEGMENTS[0]["size"]
    buf = eng.allocate(n)
    try:
        eng.read(buf, target.name("rw"), n, timeout=60)
        assert np.array_equal(buf.array, pattern64(n, 1))
        buf.array[:] = pattern64(n, 11)
        eng.write(buf, target.name("rw"), n, timeout=60)
        assert target.cmd(op="check", seg="rw", seed=11)["equal"]
    finally:
        target.cmd(op="fill", seg="rw", seed=1)
        eng.unregister(buf)


def test_many_concurrent_requests(eng: Engine, target: Target) -> None:
    size = SEGMENTS[2]["size"]
    rng = np.random.default_rng(7)
    local = eng.allocate(size)
    try:
        # 400 READs of random ranges in one batch, from 4 threads at once
        expect = pattern64(size, 3)
        errors_seen: list[BaseException] = []

        def reader(tid: int) -> None:
            try:
                reqs = []
                for _ in range(100):
                    off = int(rng.integers(0, size - 70_000))
                    n = int(rng.integers(1, 65_536))
                    reqs.append(Request(OpCode.READ, local, off, target.name("big"), off, n))
                eng.submit(reqs, deadline=120).wait()
            except BaseException as exc:  # reported below
                errors_seen.append(exc)

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert not errors_seen, errors_seen
        touched = local.array != 0
        assert touched.any()
        assert np.array_equal(local.array[touched], expect[touched])
        # 200 WRITEs of disjoint ranges in one batch; the target's bytes must match exactly
        local.array[:] = pattern64(size, 21)
        want = expect.copy()
        reqs = []
        for i in range(200):
            off = i * (size // 200) + int(rng.integers(0, 1000))
            n = int(rng.integers(1, size // 200 - 1000))
            reqs.append(Request(OpCode.WRITE, local, off, target.name("big"), off, n))
            want[off : off + n] = local.array[off : off + n]
        eng.submit(reqs, deadline=120).wait()
        assert target.cmd(op="sha", seg="big", off=0, len=size)["sha"] == _sha(want)
    finally:
        target.cmd(op="fill", seg="big", seed=3)
        eng.unregister(local)


def test_unaligned_and_zero_length_requests(eng: Engine, target: Target) -> None:
    size = SEGMENTS[0]["size"]
    local = eng.allocate(size)
    expect = pattern64(size, 1)
    try:
        cases = [(1, 1), (3, 7), (4095, 4097), (65_537, 131_071), (MiB + 13, MiB + 3), (5, 0), (size - 9, 9)]
        reqs = [Request(OpCode.READ, local, off, target.name("rw"), off, n) for off, n in cases]
        eng.submit(reqs, deadline=60).wait()
        for off, n in cases:
            assert np.array_equal(local.array[off : off + n], expect[off : off + n]), (off, n)
        local.array[:] = pattern64(size, 31)
        want = expect.copy()
        reqs = []
        for off, n in cases:
            reqs.append(Request(OpCode.WRITE, local, off, target.name("rw"), off, n))
            want[off : off + n] = local.array[off : off + n]
        eng.submit(reqs, deadline=60).wait()
        assert target.cmd(op="sha", seg="rw", off=0, len=size)["sha"] == _sha(want)
        eng.write(local, target.name("rw"), 0, timeout=30)  # a zero-length request alone
    finally:
        target.cmd(op="fill", seg="rw", seed=1)
        eng.unregister(local)


def _raw_submit(eng: Engine, op: int, local: int, remote: int, n: int, target: Target) -> object:
    """One slice straight into the executor (past the engine's own checks); waits for it."""
    tr = eng.transports["rdma"]
    st = tr._peers[target.engine_id]
    b = _native.Batch(1)
    ex = tr.executor
    assert _native.submit_one(ex.ops, ex.handle, b, op, local, remote, n, st.link.handle, 0, 0, 0) == 0
    assert b.wait(60.0), "slice never completed"
    return b


def test_bounds_refused(eng: Engine, target: Target) -> None:
    local = eng.allocate(MiB)
    try:
        with pytest.raises(errors.OutOfBoundsError):
            eng.read(local, target.name("ro"), 4096, remote_offset=MiB - 100, timeout=30)
        # the executor itself refuses a range no advertised region covers (final, not retried)
        seg = target.segments["rw"]
        b = _raw_submit(eng, 0, local.addr, seg["addr"] + seg["length"] - 10, 4096, target)
        assert b.error == E_BOUNDS
    finally:
        eng.unregister(local)


def test_write_to_readonly_buffer_is_refused_by_the_nic(eng: Engine, target: Target) -> None:
    """The engine refuses it up front. Sent anyway, straight into the executor (which leaves
    permissions to the NIC), the target NIC refuses it: the memory region has no remote-write
    access. The QP that saw the error is rebuilt and the target keeps serving."""
    local = eng.allocate(MiB)
    local.array[:] = 0xAB
    tr = eng.transports["rdma"]
    try:
        with pytest.raises(errors.PermissionDeniedError):
            eng.write(local, target.name("ro"), 4096, timeout=30)
        eng.read(local, target.name("ro"), 16, timeout=30)  # connects
        st = tr._peers[target.engine_id]
        before = tr.native.rail_counters(st.link.handle, 0)
        b = _raw_submit(eng, 1, local.addr, target.segments["ro"]["addr"], 4096, target)
        assert b.error == E_PERMISSION
        assert target.cmd(op="check", seg="ro", seed=2)["equal"], "the read-only buffer changed"
        after = tr.native.rail_counters(st.link.handle, 0)
        assert after["wc_errors"] > before["wc_errors"], (before, after)  # the NIC said no, not us
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the QP in error is reset and handshaken again
            c = tr.native.rail_counters(st.link.handle, 0)
            if c["reconnects"] > before["reconnects"] and c["ready_qps"] == st.qps_per_rail:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"QP not reconnected: {tr.native.rail_counters(st.link.handle, 0)}")
        eng.read(local, target.name("rw"), MiB, timeout=60)
        assert np.array_equal(local.array, pattern64(8 * MiB, 1)[:MiB])
    finally:
        eng.unregister(local)


def _wait_rail_ready(tr: object, st: object, before: dict[str, int]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the QP in error is reset and handshaken again
        c = tr.native.rail_counters(st.link.handle, 0)  # type: ignore[attr-defined]
        if c["reconnects"] > before["reconnects"] and c["ready_qps"] == st.qps_per_rail:  # type: ignore[attr-defined]
            return
        time.sleep(0.1)
    pytest.fail(f"QP not reconnected: {tr.native.rail_counters(st.link.handle, 0)}")  # type: ignore[attr-defined]


def test_target_nic_enforces_each_registration(eng: Engine, target: Target) -> None:
    """The initiator's region table is made to lie (a buffer longer than the target registered it,
    and a guessed rkey): the target's NIC itself refuses both, because every registration is its
    own memory region with its own key. Bytes around the buffer are untouched; the target keeps
    serving."""
    local = eng.allocate(2 * MiB)
    local.array[:] = 0xCD
    tr = eng.transports["rdma"]
    try:
        eng.read(local, target.name("rw"), 16, timeout=30)  # connects
        st = tr._peers[target.engine_id]
        honest = eng.peers.get(target.engine_id).raw_buffers
        rw, ro = target.segments["rw"], target.segments["ro"]
        lying = []
        for b in honest:
            b = dict(b)
            if int(b["addr"]) == rw["addr"]:
                b["length"] = int(b["length"]) + MiB  # past the registered end
            if int(b["addr"]) == ro["addr"]:  # a key no registration handed out
                b["desc"] = {"rdma": {"rkeys": [(k ^ 0x00A5A500) & 0xFFFFFFFF for k in b["desc"]["rdma"]["rkeys"]]}}
            lying.append(b)
        tr._set_regions(st, lying)
        before = tr.native.rail_counters(st.link.handle, 0)
        past_end = rw["addr"] + rw["length"] - 4096
        assert _raw_submit(eng, 0, local.addr, past_end, 8192, target).error == E_BOUNDS
        _wait_rail_ready(tr, st, before)
        before = tr.native.rail_counters(st.link.handle, 0)
        assert _raw_submit(eng, 1, local.addr, past_end, 8192, target).error == E_BOUNDS
        _wait_rail_ready(tr, st, before)
        before = tr.native.rail_counters(st.link.handle, 0)
        assert _raw_submit(eng, 0, local.addr, ro["addr"], 4096, target).error in (E_BOUNDS, E_PERMISSION)
        after = tr.native.rail_counters(st.link.handle, 0)
        assert after["wc_errors"] > before["wc_errors"], (before, after)  # the NIC said no, not us
        _wait_rail_ready(tr, st, before)
        assert target.cmd(op="check", seg="ro", seed=2)["equal"], "the read-only buffer changed"
        tail = target.cmd(op="sha", seg="rw", off=rw["length"] - 4096, len=4096)["sha"]
        assert tail == _sha(pattern64(rw["length"], 1)[-4096:]), "the refused WRITE landed"
    finally:
        tr._set_regions(tr._peers[target.engine_id], eng.peers.get(target.engine_id).raw_buffers)
        eng.unregister(local)
    buf = eng.allocate(MiB)
    try:
        eng.read(buf, target.name("rw"), MiB, timeout=60)
        assert np.array_equal(buf.array, pattern64(8 * MiB, 1)[:MiB])
    finally:
        eng.unregister(buf)


@pytest.mark.skipif(not (os.environ.get("TENT_AUTH_TOKEN") or os.environ.get("TENT_AUTH_TOKEN_FILE")),
                    reason="no cluster secret set (scripts/rdma-vm.sh sets one)")
def test_qp_handshake_needs_the_cluster_secret(eng: Engine, target: Target) -> None:
    """The QP handshake rides the engine's authenticated control plane: a process without the
    cluster secret gets no QP (and so no rkey use) on the target; with it, it does."""
    from tent_core.auth import AuthError, ClusterAuth, new_token
    from tent_core.metadata import ControlClient

    tr = eng.transports["rdma"]
    eng.read(eng.allocate(4096), target.name("rw"), 16, timeout=30)  # connects
    st = tr._peers[target.engine_id]
    qpn, psn, _ = tr.native.qp_info(st.link.handle, 0, 0)
    li = tr._dev_info[st.rail_devs[0][0]]
    from tent_rdma import protocol

    end = protocol.QpEnd(qpn, psn, li["gid"], li["lid"], li["mtu"], li["rd_atom"])
    body = {"kind": "connect", "initiator": "198.18.99.1:1", "incarnation": "intruder", "replace": [],
            "qps": [protocol.qp_entry(end, dev=st.devices[st.rail_devs[0][1]].name)]}
    before = target.cmd(op="passive")["qps"]
    intruder = ControlClient(target.engine_id, auth=ClusterAuth.from_token(new_token()))
    try:
        with pytest.raises(AuthError):
            intruder.call({"op": "transport", "transport": "rdma", "body": body}, 30.0)
    finally:
        intruder.close()
    assert target.cmd(op="passive")["qps"] == before, "a QP was created for a peer without the secret"


def test_conformance_kit_passes() -> None:
    """The plugin SDK's contract checks (python -m tent_core.conformance rdma), on this device."""
    cfg = json.dumps(VM_ENGINE_CONFIG["transports"]["rdma"])
    r = subprocess.run([sys.executable, "-m", "tent_core.conformance", "rdma", "--json", "--config", cfg, "--start-timeout", "900"],
                       capture_output=True, text=True, timeout=1800, env=dict(os.environ, TENT_PLUGINS="rdma"))
    assert r.stdout.strip(), r.stderr[-3000:]
    report = json.loads(r.stdout)
    bad = [c for c in report["checks"] if c["status"] != "passed"]
    assert not bad and r.returncode == 0, (bad, r.stderr[-3000:])


def test_rails_report_nic_topology(eng: Engine, target: Target) -> None:
    local = eng.allocate(4096)
    try:
        eng.read(local, target.name("rw"), 4096, timeout=30)
        rows = [r for r in eng.rail_stats() if r["transport"] == "rdma"]
        assert rows and all("numa_node" in r and "pci" in r for r in rows)
        desc = eng.transports["rdma"].local_descriptor()["devices"]
        assert all(d["name"] in rdma_ports_active() and len(d["gid"]) == 32 for d in desc)
    finally:
        eng.unregister(local)


def _netdev_of(dev: str) -> str:
    with open(f"/sys/class/infiniband/{dev}/parent") as f:
        return f.read().strip()


def _port_state(dev: str) -> str:
    with open(f"/sys/class/infiniband/{dev}/ports/1/state") as f:
        return f.read().strip()


def _wait_state(dev: str, want: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while want not in _port_state(dev):
        if time.monotonic() > deadline:
            pytest.fail(f"{dev} port never became {want} ({_port_state(dev)})")
        time.sleep(0.05)


def _rdma_rail(eng: Engine, target: Target) -> dict:
    rows = [r for r in eng.rail_stats() if r["transport"] == "rdma" and r["peer"] == target.engine_id]
    assert rows and len({r["rail"] for r in rows}) == 1, rows  # one device: one rail to the target
    return rows[0]


def _wait_rail(eng: Engine, target: Target, pred: Any, what: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        row = _rdma_rail(eng, target)
        if pred(row):
            return row
        if time.monotonic() > deadline:
            pytest.fail(f"the rail never {what} within {timeout:.0f}s: {row}")
        time.sleep(0.05)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to take the link down")
def test_port_down_fails_fast_then_recovers(eng: Engine, target: Target) -> None:
    """The only NIC's port goes down. Its rail fails fast: the executor refuses its slices at once
    and the rail monitor pauses the rail long before any deadline. A request never fails early with
    a generic error and never hangs: with no path it waits, and either ends with the typed deadline
    error at its deadline (port still down) or completes byte-exact once the port returns within
    its deadline. The rail is re-admitted (HEALTHY, carrying bytes) after the port returns."""
    dev = rdma_ports_active()[0]
    nic = _netdev_of(dev)
    local = eng.allocate(MiB)
    expect = pattern64(8 * MiB, 1)[:MiB]
    down_for_s = 30.0  # the first request's deadline: the port stays down past it
    try:
        eng.read(local, target.name("rw"), MiB, timeout=60)  # connected
        # healthy (earlier tests' refused requests may have paused it: re-admission ends in HEALTHY)
        _wait_rail(eng, target, lambda r: r["state"] == "HEALTHY", "became healthy", 120)
        try:
            subprocess.run(["ip", "link", "set", nic, "down"], check=True)
            _wait_state(dev, "DOWN")
            t0 = time.monotonic()
            h = eng.submit([Request(OpCode.READ, local, 0, target.name("rw"), 0, MiB)], deadline=down_for_s)
            paused = _wait_rail(eng, target, lambda r: r["state"] == "PAUSED", "paused", down_for_s)
            paused_after = time.monotonic() - t0
            assert paused_after < down_for_s / 2, f"the dead port's rail paused only after {paused_after:.1f}s"
            assert paused["errors"] > 0, paused  # the executor failed its slices (not a silent stall)
            with pytest.raises(errors.TentError) as info:
                h.wait()
            took = time.monotonic() - t0
            assert isinstance(info.value, errors.DeadlineExceededError), repr(info.value)
            assert took >= down_for_s - 1.0, f"failed after {took:.1f}s, before its {down_for_s:.0f}s deadline: {info.value!r}"
            assert took < down_for_s + 15, f"ended {took - down_for_s:.1f}s past its deadline"
            assert _rdma_rail(eng, target)["state"] == "PAUSED"  # heartbeats fail while the port is down

            # the next request's deadline outlasts the outage: it waits (neither done nor failed)...
            local.array[:] = 0
            h = eng.submit([Request(OpCode.READ, local, 0, target.name("rw"), 0, MiB)], deadline=180)
            time.sleep(3.0)
            assert h.poll() == "pending", "a request ended while its only port was down"
        finally:
            subprocess.run(["ip", "link", "set", nic, "up"], check=True)
        _wait_state(dev, "ACTIVE")
        h.wait()  # ...and completes, byte-exact, once the port returns
        assert np.array_equal(local.array, expect)
        # re-admitted: heartbeats pass again, the rail goes back to HEALTHY and carries bytes
        before = _rdma_rail(eng, target)["bytes"]
        deadline = time.monotonic() + 120
        while True:
            local.array[:] = 0
            eng.read(local, target.name("rw"), MiB, timeout=60)
            assert np.array_equal(local.array, expect)
            row = _rdma_rail(eng, target)
            if row["state"] == "HEALTHY" and row["bytes"] > before:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"the rail never re-admitted: {row}")
            time.sleep(0.2)
    finally:
        eng.unregister(local)


def test_killed_peer_ends_in_a_typed_error_before_the_deadline(eng: Engine, targets: tuple[Target, Target]) -> None:
    victim = targets[1]
    local = eng.allocate(32 * MiB)
    try:
        eng.read(local, victim.name("big"), 4096, timeout=60)  # connected
        deadline_s = 60.0
        t0 = time.monotonic()
        h = eng.submit([Request(OpCode.READ, local, 0, victim.name("big"), 0, 32 * MiB)], deadline=deadline_s)
        time.sleep(0.5)
        victim.kill()
        with pytest.raises(errors.TentError) as info:
            h.wait()
        took = time.monotonic() - t0
        assert isinstance(info.value, errors.PeerUnreachableError | errors.DeadlineExceededError), repr(info.value)
        assert took < deadline_s + 5, f"took {took:.1f}s"
    finally:
        victim.kill()
        eng.unregister(local)


def test_target_keeps_serving_after_a_peer_died(eng: Engine, target: Target) -> None:
    local = eng.allocate(MiB)
    try:
        eng.read(local, target.name("rw"), MiB, timeout=60)
        assert np.array_equal(local.array, pattern64(8 * MiB, 1)[:MiB])
    finally:
        eng.unregister(local)


@pytest.mark.skipif(not os.path.exists("/usr/lib/python3/dist-packages/pyverbs"), reason="python3-pyverbs not installed")
def test_pyverbs_discovery_lists_the_device() -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from tent_rdma import discovery; "
        "src, rows = discovery.inventory(); print(src, [(r['device'], r['state'], len(r['gids'])) for r in rows])"
    )
    out = subprocess.run(["/usr/bin/python3", "-c", code, os.path.dirname(HERE)], capture_output=True, text=True,
                         timeout=900, check=True).stdout
    assert out.startswith("pyverbs"), out
    assert any(d in out for d in rdma_ports_active()), out
    assert "ACTIVE" in out


def test_executor_loads_without_pyverbs() -> None:
    out = subprocess.run([sys.executable, "-c", "import sys; sys.modules['pyverbs'] = None; "
                          "from tent_rdma.transport import RdmaTransport; print(RdmaTransport().probe())"],
                         capture_output=True, text=True, timeout=900, check=True).stdout
    assert "available=True" in out and "via sysfs" in out, out
