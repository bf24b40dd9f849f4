"""The RL checkpoint / weight-sync backend: unit behaviour in one process, and the runnable example
(separate trainer and rollout processes) end to end."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from refhub.checkpoint import ROLLOUT, TRAINER, RefhubCheckpointEngine, shard_of
from refhub.client import RefhubError
from refhub.server import Server

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "rl_weight_sync.py"


@pytest.fixture
def server() -> Iterator[str]:
    srv = Server("tcp://127.0.0.1:0")
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.address
    srv.stop()
    t.join(5)


def model(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(step)
    return {
        "big": rng.standard_normal((1024, 1024)).astype(np.float32),  # 4 MB: served in place
        "small": rng.standard_normal(1000).astype(np.float32),  # packed
        "ids": rng.integers(0, 1 << 40, 64),
    }


def test_shard_of_and_topology() -> None:
    names = [f"layers.{i}.w" for i in range(100)]
    for n in names:
        assert shard_of(n, 1) == 0
        assert 0 <= shard_of(n, 4) < 4
        assert shard_of(n, 4) == shard_of(n, 4)
    assert len({shard_of(n, 4) for n in names}) == 4
    t, r = RefhubCheckpointEngine.build_topology(2, 3, [{"server": "a"}] * 5)
    assert t == {"role": [TRAINER] * 2, "rank": [0, 1], "world_size": [2, 2]}
    assert r == {"role": [ROLLOUT] * 3, "rank": [0, 1, 2], "world_size": [2, 2, 2]}
    with pytest.raises(ValueError, match="disagree"):
        RefhubCheckpointEngine.build_topology(1, 1, [{"server": "a"}, {"server": "b"}])


def test_publish_and_receive_in_place(server: str) -> None:
    tr = RefhubCheckpointEngine(server=server, model="m1", timeout=30)
    ro = RefhubCheckpointEngine(server=server, model="m1", timeout=30)
    tr.init_process_group(TRAINER, 0, 1)
    ro.init_process_group(ROLLOUT, 0, 1)
    try:
        with pytest.raises(RuntimeError, match="register_receive_buffers"):
            ro.receive()
        targets = {k: np.zeros_like(v) for k, v in model(0).items()}
        ro.register_receive_buffers(targets)
        weights = model(1)
        assert asyncio.run(tr.send_weights(iter(weights.items()))) == 1
        for v in weights.values():
            v += 1  # copy mode: the trainer may change its tensors right after send_weights
        got = asyncio.run(_collect(ro.receive_weights()))
        assert ro.version == 1
        for k, v in model(1).items():
            assert got[k] is targets[k], "received in place"
            assert np.array_equal(targets[k], v)
        assert tr.publish(model(2)) == 2
        tr.wait_received(2, replicas=0)
        assert ro.receive() == 2, "default: the next version after the one held"
        assert all(np.array_equal(targets[k], v) for k, v in model(2).items())
        with pytest.raises(ValueError, match="not newer"):
            tr.publish(model(3), version=2)
        tr.publish(model(5), version=5)
        assert ro.receive(5) == 5
        tr.wait_received(5, replicas=1, timeout=10)
        with pytest.raises(TimeoutError):
            ro.receive(timeout=0.5)  # nothing newer than 5
    finally:
        ro.close()
        tr.close()


async def _collect(agen) -> dict:
    return {n: t async for n, t in agen}


def test_layout_mismatch_is_an_error(server: str) -> None:
    tr = RefhubCheckpointEngine(server=server, model="m2", timeout=10)
    ro = RefhubCheckpointEngine(server=server, model="m2", timeout=10)
    tr.init_process_group(TRAINER, 0, 1)
    ro.init_process_group(ROLLOUT, 0, 1)
    try:
        bad = {k: np.zeros_like(v) for k, v in model(0).items()}
        bad["big"] = np.zeros((1024, 512), np.float32)
        ro.register_receive_buffers(bad)
        tr.publish(model(1))
        with pytest.raises(RefhubError, match="layout"):
            ro.receive(1)
    finally:
        ro.close()
        tr.close()


def test_zero_copy_mode_publishes_cpu_tensors_in_place(server: str) -> None:
    tr = RefhubCheckpointEngine(server=server, model="m3", copy=False, timeout=10)
    ro = RefhubCheckpointEngine(server=server, model="m3", timeout=10)
    tr.init_process_group(TRAINER, 0, 1)
    ro.init_process_group(ROLLOUT, 0, 1)
    try:
        w = model(7)
        targets = {k: np.zeros_like(v) for k, v in w.items()}
        ro.register_receive_buffers(targets)
        tr.publish(w, version=1)
        assert tr._snap == {}, "no snapshot copies in zero-copy mode"
        assert ro.receive(1) == 1
        assert all(np.array_equal(targets[k], v) for k, v in w.items())
    finally:
        ro.close()
        tr.close()


def _run_example(*args: str, env: dict[str, str] | None = None) -> dict:
    out = subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=400,
                         env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_example_numpy() -> None:
    res = _run_example("--trainers", "2", "--rollouts", "2", "--steps", "3", "--mb", "8",
                       env={"REFHUB_EXAMPLE_BACKEND": "numpy"})
    assert res == {"ok": True, "steps": 3, "rollout_receipts": 6, "backend": "numpy/cpu"}


def test_example_torch() -> None:
    pytest.importorskip("torch")
    res = _run_example("--trainers", "2", "--rollouts", "1", "--steps", "2", "--mb", "8")
    assert res["ok"] and res["rollout_receipts"] == 2 and res["backend"].startswith("torch/")
