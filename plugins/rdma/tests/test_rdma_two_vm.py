"""Across two hosts (two guests of `scripts/rdma-vm.sh --vms 2`, one rxe device per virtual NIC):
byte-exact transfers over every rail, NIC topology on the rails, and one of two NICs taken down
in the middle of transfers with zero application errors and the rail re-admitted afterwards.

Runs in guest "a" through `python -m tent_rdma.testbed` (TENT_TWO_VM_TARGET names guest b's engine); skipped elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from rdma_helpers import VM_ENGINE_CONFIG, pattern64, rdma_engine

from tent_core.engine import Engine

TARGET = os.environ.get("TENT_TWO_VM_TARGET", "")
pytestmark = pytest.mark.skipif(not TARGET, reason="runs in guest a of scripts/rdma-vm.sh --vms 2 (python -m tent_rdma.testbed)")
MiB = 1 << 20
SIZE = 32 * MiB


@pytest.fixture(scope="module")
def eng() -> Iterator[Engine]:
    e = rdma_engine(VM_ENGINE_CONFIG, host=os.environ.get("TENT_VM_IP", "127.0.0.1"))
    yield e
    e.close()


def _rails(eng: Engine) -> list[dict]:
    return sorted((r for r in eng.rail_stats() if r["transport"] == "rdma"), key=lambda r: r["index"])


def test_byte_exact_over_every_rail(eng: Engine) -> None:
    buf = eng.allocate(SIZE)
    try:
        eng.read(buf, f"{TARGET}/data", SIZE, timeout=300)
        assert np.array_equal(buf.array, pattern64(SIZE, 1))
        buf.array[:] = pattern64(SIZE, 7)
        eng.write(buf, f"{TARGET}/sink", SIZE, timeout=300)
        buf.array[:] = 0
        eng.read(buf, f"{TARGET}/sink", SIZE, timeout=300)
        assert np.array_equal(buf.array, pattern64(SIZE, 7))
        rails = _rails(eng)
        n_nics = len(os.environ.get("TENT_RDMA_DEVS", "").split(","))
        assert len(rails) == n_nics, rails
        assert all(r["bytes"] > 0 for r in rails), rails  # the engine sprayed over every NIC
    finally:
        eng.unregister(buf)


def test_rails_report_pci_and_numa(eng: Engine) -> None:
    rails = _rails(eng)
    assert rails
    for r in rails:
        assert r["pci"] and r["pci"].count(":") == 2, r  # the virtio NIC's PCI function
        assert isinstance(r["numa_node"], int)


def test_nic_down_mid_transfer_zero_errors_and_readmission(eng: Engine) -> None:
    nics = os.environ["TENT_VM_NICS"].split(",")
    if len(nics) < 2:
        pytest.skip("needs two NICs")
    victim = nics[1]
    buf = eng.allocate(16 * MiB)
    check = eng.allocate(16 * MiB)
    flap_done = threading.Event()
    errors: list[str] = []

    def flap() -> None:
        try:
            time.sleep(2.0)
            subprocess.run(["ip", "link", "set", victim, "down"], check=True)
            time.sleep(6.0)
        finally:
            subprocess.run(["ip", "link", "set", victim, "up"], check=True)
            flap_done.set()

    t = threading.Thread(target=flap)
    rounds = 0
    try:
        t.start()
        deadline = time.monotonic() + 240
        while not flap_done.is_set() or rounds < 2:
            if time.monotonic() > deadline:
                pytest.fail(f"transfers did not keep up: {rounds} rounds")
            seed = 100 + rounds
            try:
                eng.read(buf, f"{TARGET}/data", 16 * MiB, remote_offset=(rounds % 2) * 16 * MiB, timeout=120)
                if not np.array_equal(buf.array, pattern64(SIZE, 1)[(rounds % 2) * 16 * MiB :][: 16 * MiB]):
                    errors.append(f"round {rounds}: READ bytes differ")
                buf.array[:] = pattern64(16 * MiB, seed)
                eng.write(buf, f"{TARGET}/sink", 16 * MiB, timeout=120)
                eng.read(check, f"{TARGET}/sink", 16 * MiB, timeout=120)
                if not np.array_equal(check.array, buf.array):
                    errors.append(f"round {rounds}: WRITE bytes differ")
            except Exception as exc:
                errors.append(f"round {rounds}: {type(exc).__name__}: {exc}")
            rounds += 1
        t.join(30)
        assert not errors, errors
        # the rail comes back: its port is up, its QPs are rebuilt, heartbeats re-admit it, it carries bytes
        before = _rails(eng)[1]["bytes"]
        deadline = time.monotonic() + 120
        while True:
            eng.read(buf, f"{TARGET}/data", 16 * MiB, timeout=120)
            r = _rails(eng)[1]
            if r["state"] == "HEALTHY" and r["bytes"] > before:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"rail 1 never re-admitted: {r}")
            time.sleep(0.2)
        assert np.array_equal(buf.array, pattern64(SIZE, 1)[: 16 * MiB])
    finally:
        if t.is_alive():
            t.join(30)
        eng.unregister(buf)
        eng.unregister(check)
