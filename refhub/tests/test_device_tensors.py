"""refhub with device tensors (the simulated device: its memory is device memory to the engine).

In one process: every combination of publisher/reader mode between device tensors, and device <->
host tensors, with the device checksum. Across processes: a publisher whose device memory no
transport of the reader reaches (its device IPC is off): direct mode goes through the publisher's
target-side staging over TCP, copy mode through its stager's pinned slots; checksums are computed
on the devices, and a mutated device tensor fails verification."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tent_core.engine")

from refhub import client as C  # noqa: E402
from tent_core import Engine  # noqa: E402
from tent_core.simdev import SimArray, SimDevicePlugin  # noqa: E402
from tent_core.testing import pattern  # noqa: E402

MB = 1 << 20
HERE = Path(__file__).parent
SIZES = [3 * MB + 5, 2 * MB, 7000, 123, 2 * MB + 4096, 65536, 5 * MB - 3]


@pytest.fixture
def server():
    from refhub.server import start_embedded, stop_embedded

    addr = start_embedded(hb_timeout=3.0)
    yield addr
    stop_embedded(addr)


@pytest.fixture
def small_batches(monkeypatch):
    monkeypatch.setattr(C, "BATCH", 1 * MB)
    monkeypatch.setattr(C, "CHUNK", 512 * 1024)
    monkeypatch.setattr(C, "STAGE_SLOT", 1 * MB)


@pytest.fixture
def engine():
    eng = Engine({"transports": {"simdev": {"ipc": False}}}, transports=["tcp", "simdev"], plugins=[SimDevicePlugin()])
    yield eng
    eng.close()


def _device(sizes, seed):
    out = []
    for i, n in enumerate(sizes):
        a = SimArray(n)
        a.upload(pattern(n, seed + i))
        out.append(a)
    return out


@pytest.mark.parametrize("pub_mode,rd_mode", [("direct", "direct"), ("copy", "direct"), ("direct", "copy"), ("copy", "copy")])
def test_device_to_device_in_one_process(server, small_batches, engine, pub_mode, rd_mode) -> None:
    src = _device(SIZES, 10)
    p = C.open("m", replica="pub", server=server, mode=pub_mode, engine=engine)
    for i, t in enumerate(src):
        p.register(f"t{i}", t)
    p.publish(1)
    r = C.open("m", replica="rd", server=server, mode=rd_mode, engine=engine)
    dst = [SimArray(n) for n in SIZES]
    for i, t in enumerate(dst):
        r.register(f"t{i}", t)
    assert r.replicate(1, timeout=60) == 1
    for i, (d, n) in enumerate(zip(dst, SIZES, strict=True)):
        assert np.array_equal(d.download(), pattern(n, 10 + i)), f"t{i}"
    st = r.stats
    assert st["verified"]
    large = sum(1 for n in SIZES if n >= C.TINY)
    # direct receivers check large tensors on their device; copy-mode ones hash the landing buffer
    assert st["device_checksums"] == (large if rd_mode == "direct" else 0)
    r.close()
    p.close()


def test_device_publisher_host_reader_and_back(server, small_batches, engine) -> None:
    src = _device(SIZES, 20)
    p = C.open("m", replica="pub", server=server, engine=engine)
    for i, t in enumerate(src):
        p.register(f"t{i}", t)
    p.publish(1)
    r = C.open("m", replica="host", server=server, engine=engine)
    host = [np.zeros(n, np.uint8) for n in SIZES]
    for i, t in enumerate(host):
        r.register(f"t{i}", t)
    assert r.replicate(1, timeout=60) == 1 and r.stats["verified"]
    assert all(np.array_equal(h, pattern(n, 20 + i)) for i, (h, n) in enumerate(zip(host, SIZES, strict=True)))
    p.unpublish()
    # a host publisher (host checksums), device readers in both modes
    for mode in ("direct", "copy"):
        d = C.open("m", replica=f"dev-{mode}", server=server, mode=mode, engine=engine)
        dst = [SimArray(n) for n in SIZES]
        for i, t in enumerate(dst):
            d.register(f"t{i}", t)
        assert d.replicate(1, timeout=60) == 1 and d.stats["verified"]
        assert all(np.array_equal(a.download(), pattern(n, 20 + i)) for i, (a, n) in enumerate(zip(dst, SIZES, strict=True)))
        d.close()
    r.close()
    p.close()


class Publisher:
    def __init__(self, server: str, mode: str, sizes: list[int], seed: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "device_worker.py"), server, mode, ",".join(map(str, sizes)), str(seed)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = json.loads(self._line(60))

    def _line(self, timeout: float) -> str:
        out: list[str] = []
        t = threading.Thread(target=lambda: out.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        t.start()
        t.join(timeout)
        if not out or not out[0]:
            self.proc.kill()
            raise RuntimeError("device publisher did not answer")
        return out[0]

    def send(self, cmd: str) -> dict:
        self.proc.stdin.write(cmd + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return json.loads(self._line(30))

    def close(self) -> None:
        try:
            self.proc.stdin.write("quit\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
            self.proc.wait(30)
        except Exception:
            self.proc.kill()
            self.proc.wait(10)


@pytest.mark.parametrize("mode", ["direct", "copy"])
def test_device_tensors_across_processes(server, small_batches, mode) -> None:
    sizes = [6 * MB + 11, 2 * MB + 7, 5000, 77]
    pub = Publisher(server, mode, sizes, 30)
    try:
        with Engine({"transports": {"simdev": {"ipc": False}}, "staging_chunk_bytes": MB}, transports=["tcp", "simdev"],
                    plugins=[SimDevicePlugin()]) as eng:
            r = C.open("dm", replica="rd", server=server, mode=mode, engine=eng)
            dst = [SimArray(n) for n in sizes]
            for i, t in enumerate(dst):
                r.register(f"t{i}", t)
            assert r.replicate(1, timeout=60) == 1
            for i, (d, n) in enumerate(zip(dst, sizes, strict=True)):
                assert np.array_equal(d.download(), pattern(n, 30 + i)), f"t{i}"
            assert r.stats["verified"]
            if mode == "direct":  # the publisher's device memory was reached through its staging
                from tent_core.routing import path_kind

                assert r.stats["staged_slices"] == 0 and r.stats["device_checksums"] == 2
                peer = eng.peers.lookup(pub.info["ready"])
                assert "both-staged" in {path_kind(p) for p in peer.plans.values()}
            else:
                assert r.stats["staged_slices"] >= 8
            # a host reader of the same device tensors
            r2 = C.open("dm", replica="rd-host", server=server, mode=mode, engine=eng)
            host = [np.zeros(n, np.uint8) for n in sizes]
            for i, t in enumerate(host):
                r2.register(f"t{i}", t)
            assert r2.replicate(1, timeout=60) == 1
            assert all(np.array_equal(h, pattern(n, 30 + i)) for i, (h, n) in enumerate(zip(host, sizes, strict=True)))
            r2.close()
            # the publisher breaks its promise on the device: the device checksum catches it
            assert pub.send("mutate")["ok"]
            r3 = C.open("dm", replica="rd-late", server=server, mode=mode, engine=eng)
            for i, n in enumerate(sizes):
                r3.register(f"t{i}", SimArray(n))
            with pytest.raises(C.ChecksumError, match="t0"):
                r3.replicate(1, timeout=60)
            r3.close()
            r.close()
    finally:
        pub.close()
