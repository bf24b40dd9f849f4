"""Which transport a same-host replicate uses. The shm transport's default mode (memfd) reaches only
engine-allocated memory (memfd-backed, mapped by the reader); a numpy array register()'d in place is
reachable through CMA only, which shm leaves off by default, so between two processes of one host its
bytes go over TCP. `ShardHandle.allocate()` puts a tensor in engine memory: then shm carries them."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tent_core.engine")

from refhub import client as C  # noqa: E402

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
from same_host_publisher import SIZES, content  # noqa: E402


@pytest.fixture
def server():
    from refhub.server import start_embedded, stop_embedded

    addr = start_embedded(hb_timeout=3.0)
    yield addr
    stop_embedded(addr)


def _per_transport(engine) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for r in engine.rail_stats():
        b, e = out.get(r["transport"], (0, 0))
        out[r["transport"]] = (b + r["bytes"], e + r["errors"])
    return out


def _replicate_from_child(server: str, model: str, pub_how: str, rd_how: str) -> dict[str, tuple[int, int]]:
    """A child publishes, we replicate: (bytes, failed slices) per transport for this replicate."""
    child = subprocess.Popen([sys.executable, os.path.join(HERE, "same_host_publisher.py"), server, model, pub_how],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line.startswith("ready"), line
        r = C.open(model, replica="rd", server=server)
        try:
            dst = []
            for i, n in enumerate(SIZES):
                if rd_how == "allocate":
                    dst.append(r.allocate(f"t{i}", n))
                else:
                    dst.append(np.zeros(n, np.uint8))
                    r.register(f"t{i}", dst[-1])
            before = _per_transport(r.engine)
            assert r.replicate(1, timeout=60) == 1
            after = _per_transport(r.engine)
            delta = {t: (after[t][0] - before.get(t, (0, 0))[0], after[t][1] - before.get(t, (0, 0))[1]) for t in after}
            assert r.stats["verified"]
            for i, n in enumerate(SIZES):
                assert (dst[i].reshape(-1) == content(i, n)).all(), i
            return delta
        finally:
            r.close()
    finally:
        if child.poll() is None:
            child.stdin.write("\n")
            child.stdin.flush()
        child.wait(timeout=30)


def _shm_mode() -> str | None:
    try:
        from tent_shm.plugin import DEFAULT_MODE
    except ImportError:
        return None
    return DEFAULT_MODE


@pytest.mark.parametrize("rd_how", ["allocate", "register"])
def test_allocated_tensors_replicate_over_shm(server, rd_how) -> None:
    if _shm_mode() is None:
        pytest.skip("tent-shm is not installed")
    delta = _replicate_from_child(server, f"alloc-{rd_how}", "allocate", rd_how)
    large = sum(n for n in SIZES if n >= C.TINY)
    shm_bytes, shm_errors = delta.get("shm", (0, 0))
    assert shm_bytes >= large, delta  # every byte of the large tensors (and the pack) over shm
    assert shm_errors == 0, delta
    assert delta.get("tcp", (0, 0))[0] == 0, delta  # nothing went over TCP


def test_registered_numpy_memory_is_not_reachable_by_shm_in_memfd_mode(server) -> None:
    """Why the demo moved its bytes over TCP: documents the default, and fails once it changes."""
    if _shm_mode() != "memfd":
        pytest.skip(f"shm default mode is {_shm_mode()}")
    delta = _replicate_from_child(server, "registered", "register", "register")
    large = sum(n for n in SIZES if n >= C.TINY)
    assert delta.get("tcp", (0, 0))[0] >= large, delta
    assert delta.get("shm", (0, 0))[0] < large, delta


def test_allocate_shapes_dtypes_and_layout(server) -> None:
    h = C.open("shapes", replica="a", server=server)
    try:
        big = h.allocate("big", (1024, 1024), np.float32)  # 4 MB: engine memory, in the handle's segment
        small = h.allocate("small", 10, np.int16)  # tiny: plain memory, packed at publish
        assert big.shape == (1024, 1024) and big.dtype == np.float32 and not big.any()
        assert small.shape == (10,) and small.dtype == np.int16
        assert h.items["big"].buf is not None and h.items["big"].buf.segment == h.segment
        assert h.items["small"].buf is None
        big[:] = 1.5
        h.publish(1)
        with pytest.raises(C.RefhubError):
            h.allocate("other", 10)  # published: unpublish first
        h.unpublish()
        h.allocate("big", 3 << 20)  # re-allocating a name replaces it
        assert h.items["big"].nbytes == 3 << 20
    finally:
        h.close()
