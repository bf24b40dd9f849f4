"""Synthesized paths across processes: a file here <-> memory in another process, through pooled
host staging buffers and TCP, with checksums; one batch handle, cancellation, no leaked buffers."""

from __future__ import annotations

import numpy as np
import pytest
from peers import Peer, sha

from tent_core import READ, READ_ONLY, WRITE, CancelledError, Engine, NoPathError, Request
from tent_core.testing import pattern


@pytest.fixture(scope="module")
def peer():
    p = Peer(size=48 << 20)
    yield p
    p.close()


@pytest.fixture
def engine():
    eng = Engine({"staging_chunk_bytes": 1 << 20, "staging_buffers": 4}, transports=["gds", "tcp"])
    if "gds" not in eng.transports:
        pytest.fail(f"gds transport unavailable: {eng.availability}")
    yield eng
    eng.close()


def test_file_to_remote_memory_and_back(engine, peer, tmp_path):
    n = 40_000_003  # not a multiple of the chunk: the tail chunk is short
    data = pattern(n, seed=5)
    path = tmp_path / "weights.bin"
    data.tofile(path)
    f = engine.register_file(path, segment="ckpt")
    h = engine.submit([Request(WRITE, f, 0, peer.seg("rw"), 1000, n)])
    assert h.wait(60)
    assert peer.digest("rw", 1000, n) == sha(data)
    # and remote memory -> the file (a different region), one batch with a direct request too
    out = engine.register_file(tmp_path / "out.bin", segment="ckpt", size=n)
    direct = engine.allocate(1 << 20)
    h = engine.submit([Request(READ, out, 0, peer.seg("ro"), 7, n), Request(READ, direct, 0, peer.seg("ro"), 0, 1 << 20)])
    assert h.wait(60) and h.poll() == "done"
    src = pattern(peer.size, seed=1)
    assert sha(np.fromfile(tmp_path / "out.bin", np.uint8)) == sha(src[7 : 7 + n])
    assert np.array_equal(direct.array, src[: 1 << 20])
    # staging is pooled and bounded: never more buffers than configured
    assert engine._submitter.staging is not None and engine._submitter.staging._made <= 4
    peer.call(cmd="fill", segment="rw", seed=0)


def test_staged_transfer_cancel_and_permissions(engine, peer, tmp_path):
    path = tmp_path / "big.bin"
    pattern(40 << 20, seed=3).tofile(path)
    f = engine.register_file(path, segment="ckpt")
    h = engine.submit([Request(WRITE, f, 0, peer.seg("rw"), 0, 40 << 20)])
    h.cancel()
    with pytest.raises(CancelledError):
        h.wait(30)
    ro = engine.register_file(path, segment="ro-files", perm=READ_ONLY)
    from tent_core import PermissionDeniedError

    with pytest.raises(PermissionDeniedError):  # READ into a read-only file: refused at submit
        engine.submit([Request(READ, ro, 0, peer.seg("rw"), 0, 4096)])
    peer.call(cmd="fill", segment="rw", seed=0)


def test_no_path_at_all_is_a_clear_error(peer, tmp_path):
    with Engine(transports=["tcp"]) as eng:  # no file transport installed in this engine
        path = tmp_path / "x.bin"
        path.write_bytes(b"x" * 4096)
        f = eng.register_file(path)
        with pytest.raises(NoPathError, match="file"):
            eng.submit([Request(WRITE, f, 0, peer.seg("rw"), 0, 4096)])
